// Package server is the gRPC front door of the CA: Istio's
// IstioCertificateService over TLS. It parses requests, picks the cluster
// a request names, authenticates its caller, parses its CSR, and hands a
// door-neutral request to the issuance pipeline, which authorizes, signs,
// audits and counts it; what it refuses before then it records through
// the pipeline too. It maps every result to a gRPC status in one place
// (classify), bounds what a client can hold (transport limits, the busy
// tier, ConnGuard for connections on which no caller authenticated, the
// CPU limiter every CSR check and signature runs in), and keeps its own
// TLS serving certificate, issued by the CA, fresh.
//
// Its Options are serve's flags of the door (listening, serving
// certificate, overload and connection limits, shutdown): they define,
// validate and build it (Options.Build), wired to the checks of callers,
// the pipeline and the issuer the process hands over (Wiring).
//
// It does not decide who may have which identity (authz), how requests
// are audited and counted (issuance) nor how certificates are built (ca).
package server
