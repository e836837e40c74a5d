// Package server is the gRPC edge of the CA: Istio's
// IstioCertificateService over TLS. It parses requests, runs authentication,
// authorization and signing through small interfaces it owns, maps every
// error to a gRPC status in one place, and keeps its own TLS serving
// certificate, issued by the CA, fresh.
//
// It does not decide who may have which identity (authz) nor how
// certificates are built (ca).
package server
