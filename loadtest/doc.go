// Package loadtest drives a workload-ca (or any IstioCertificateService)
// the way a fleet of ztunnels does, and measures it. The `workload-ca
// loadtest` command and `make bench` use it.
//
// # Plan
//
// A plan is a JSON array with one object per simulated ztunnel:
//
//	[
//	  {"token": "<ztunnel pod-bound service-account JWT, audience istio-ca>",
//	   "identities": ["spiffe://cluster.local/ns/demo/sa/web", "spiffe://cluster.local/ns/demo/sa/db"]},
//	  ...
//	]
//
// token is sent as "authorization: Bearer <token>"; each identity is asked
// for with ImpersonatedIdentity metadata (ztunnel's shared mode), so the
// identities should be those of pods on the ztunnel's node. An optional
// "clusterId" is sent in the clusterid header (default Kubernetes, Istio's
// default cluster id): a plan can hold the ztunnels of several clusters.
// Unknown fields are an error.
//
// # Behaviour
//
// Every ztunnel has its own gRPC connection over TLS 1.3, with fixed
// HTTP/2 flow-control windows as ztunnel's client has them, and at most
// Config.InFlight (default 8) requests outstanding, as ztunnel's
// certificate fetcher does. Keys and CSRs (ECDSA P-256, empty subject, one
// critical URI SAN: ztunnel's shape) are generated before anything is
// timed: a small pool per identity (Config.CSRsPerIdentity), each key used
// for its own CSR only, and the requests are reused round-robin. ztunnel
// makes a fresh key for every certificate; the server cannot tell a reused
// CSR from a new one (it parses and verifies every CSR), and pregenerating
// keeps the load generator's CPU, which shares the machine with the
// server, to TLS, gRPC and a parse of each response.
//
// Three modes:
//
//   - max rate (Rate 0): closed loop, every ztunnel keeps InFlight requests
//     outstanding for Warmup+Duration;
//   - target rate (Rate > 0): open loop, requests are due at a fixed total
//     rate spread round-robin over the ztunnels, and latency is measured
//     from when a request was due (so a slow server is charged for the
//     queueing it causes, not hidden by it); the summary's start lag says
//     how much of that was this process sending late;
//   - once (Once): a cold-start storm, every ztunnel connects and asks for
//     each of its identities once (retrying failures), all at the same time;
//     the summary says when every ztunnel held all its certificates.
//
// Only requests that complete inside the measured window (after Warmup,
// for Duration) count in the rate and the latency percentiles.
package loadtest
