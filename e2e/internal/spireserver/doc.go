// Package spireserver runs a real SPIRE server (spire-server, built from
// the module e2e/spiretools/go.mod pins) on loopback for the e2e suite's
// federation test: a trust domain of its own, a SQLite datastore and the
// memory key manager in a directory of the test's, its admin API on a unix
// socket there, and a SPIFFE bundle endpoint on 127.0.0.1 with the
// https_spiffe profile, federating with the trust domains it is given. No
// node attestor: the test takes SVIDs with `spire-server x509 mint`.
//
// It owns the server's configuration, its process (through
// e2e/internal/proc, so it dies with the test binary) and the admin
// commands the test needs (bundle show/list/set, federation refresh, x509
// mint, localauthority x509 prepare/activate), each a run of the same
// binary against the socket. It does not know what the peer is.
package spireserver
