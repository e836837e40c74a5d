// Package caclient is a client of IstioCertificateService that behaves like
// ztunnel: it makes a P-256 key and a CSR with one critical URI SAN, sends it
// with a bearer token and optional ImpersonatedIdentity over TLS, and checks
// the response the way ztunnel does. It also reads the roots that verify the
// CA (ReadRoots), and prints or writes what it got (Result.Print,
// Result.WriteFiles). The `workload-ca request` command and the end-to-end
// tests use it; it holds no command-line flags.
package caclient
