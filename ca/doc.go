// Package ca is the certificate authority: it holds the active signing
// material, checks certificate signing requests, issues X.509-SVIDs that
// follow the SPIFFE specification, verifies every certificate it issues, and
// serves the chain and root bundle that clients need.
//
// Where the CA material comes from (files, a Secret, a KMS) is
// ca/keystore's concern; who may receive which identity is authz's.
package ca
