// Package keystore is where CA material comes from: it reads a signing key,
// its certificate, intermediates and the root bundle from a directory laid
// out like Istio's cacerts Secret or a cert-manager TLS Secret, and it can
// generate and persist a self-signed root when the directory is empty. It
// also reads a plug-in root CA (LoadRootDir: root-cert.pem and
// root-key.pem, or tls.crt, tls.key and ca.crt) and mints intermediates
// from it (GenerateIntermediate), for the rotating CA of package
// ca/castate; the root's key stays in memory. Either directory may hold
// the certificates only, the key being in a KMS or an HSM (OpenKey: a
// go.step.sm/crypto KMS URI, checked before anything is opened by
// CheckKeyURI; SignsRemotely tells a KMS that signs elsewhere from a key
// file). Which KMS types a binary accepts is decided by its imports
// (package kmstypes registers those the CA ships).
//
// It does not sign, rotate or publish anything; package ca validates and
// uses the material, and rotation decides when new material is needed.
package keystore
