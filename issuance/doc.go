// Package issuance is the one pipeline behind every front door: a door
// (the gRPC CreateCertificate service, the PodCertificateRequest
// controller) turns what it received into a door-neutral Request and hands
// it over; the pipeline authorizes it (the door's node rule, then the
// issuance policy, if one is configured: an interface it owns), signs it,
// writes its audit record and counts its result, the same way for every
// door.
//
// It owns: the Request a door hands over, the results and denial reasons
// that label audit records and metrics (Classify: every error becomes a
// result here), the audit record format, which fails closed (a
// certificate whose record cannot be written is not handed out), and the
// summaries of refusals that decide nothing.
//
// It does not own: transport (reading tokens, headers, gRPC codes or
// Kubernetes conditions: each door maps a result to its own answer), how a
// caller is authenticated (authz/tokenreview), the doors' node rules (authz
// for the gRPC door, podcert's for kubelets), what the issuance policies
// say (package policy), or how a certificate is built and signed (ca).
package issuance
