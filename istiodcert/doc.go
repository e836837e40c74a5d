// Package istiodcert keeps istiod's serving certificate issued by our CA.
//
// ztunnel and istio-agent verify istiod's xDS port (15012) with the root
// file they verify the CA with (XDS_ROOT_CA defaults to CA_ROOT_CA). Once
// that root is ours, istiod must serve a certificate that chains to it, or
// no proxy can fetch its configuration. Istio's chart mounts the Secret
// istiod-tls (kubernetes.io/tls: tls.crt, tls.key, ca.crt) at
// /var/run/secrets/istiod/tls when it exists, and istiod then serves
// tls.crt and reloads it when the file changes.
//
// The Publisher, run by the leader, keeps that Secret holding a DNS
// certificate for istiod's service names, issued to a key of its own,
// with the certificates above it and our roots in ca.crt. It reissues at
// two thirds of the certificate's life, when the CA signs with another
// certificate, when the names or roots change, and when someone edits or
// deletes the Secret. A Secret of that name that we did not create (one
// istio-csr or cert-manager wrote) is left alone and reported.
//
// Its Options are serve's flags of istiod's certificate (whether to keep
// it, its namespace, Secret, names and lifetime), checked and applied to a
// Config.
package istiodcert
