// Package upstreamconfig is the file that names the CA's upstream CA
// (--ca-upstream-config; see docs/upstream.md): its YAML schema, its
// checks when the CA starts, and the upstream.Minter it describes (a Vault
// or OpenBao PKI engine through ca/upstream/vault, or a cert-manager issuer
// through ca/upstream/certmanager).
//
// It does not own: how an intermediate is asked for, checked or pinned
// (ca/upstream and its authorities), when one is asked for (ca/rotation),
// where the result is kept (ca/castate), or metrics (the caller passes an
// upstream.Observer).
package upstreamconfig
