// Package inspect describes certificates, as `workload-ca inspect` prints
// them: for each certificate of a set (a file, a ClusterTrustBundle) its
// role, identity, key, validity, which certificate of the set signs it and
// which root it verifies to, as text for a terminal or as JSON.
//
// It does not read files or the API server (the command does), nor judge
// whether a certificate is fit for the CA (package ca does).
package inspect
