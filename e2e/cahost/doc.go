// Package cahost runs the real `workload-ca serve` binary for the end-to-end
// tests and the demo, and asks it for certificates with the real
// `workload-ca request`, so the tests exercise the shipped command lines,
// flag parsing, TLS and exit codes, not an in-process copy.
//
// It owns starting the CA on a free loopback port with a fresh CA directory,
// waiting until the gRPC health service reports SERVING over TLS verified
// against the CA's own root (<ca-dir>/root-cert.pem, or the root bundle of
// the --ca-secret Secret), a graceful stop (SIGTERM, then SIGKILL) or a
// SIGKILL (a crashed replica), and
// turning `request` output into a Result or a *RefusedError carrying the gRPC
// code. Process lifetime (no orphans) comes from e2e/internal/proc.
//
// It does not create Kubernetes objects or tokens (see e2e/controlplane),
// nor build the binary (make build).
package cahost
