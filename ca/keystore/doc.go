// Package keystore is where CA material comes from: it reads a signing key,
// its certificate, intermediates and the root bundle from a directory laid
// out like Istio's cacerts Secret or a cert-manager TLS Secret, and it can
// generate and persist a self-signed root when the directory is empty.
//
// It does not sign, rotate or publish anything; package ca validates and
// uses the material, and rotation decides when new material is needed.
package keystore
