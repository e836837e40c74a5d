// Package server is the gRPC edge of the CA: Istio's
// IstioCertificateService over TLS. It parses requests, runs authentication,
// authorization and signing through small interfaces it owns, maps every
// error to a gRPC status in one place, writes one audit record per
// decision (summarizing the refusals that decide nothing and those of
// callers who did not authenticate), bounds what a client can hold
// (transport limits, the busy tier, ConnGuard for connections on which no
// caller authenticated), and keeps its own TLS serving certificate, issued
// by the CA, fresh.
//
// It does not decide who may have which identity (authz) nor how
// certificates are built (ca).
package server
