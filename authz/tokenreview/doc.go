// Package tokenreview turns a bearer token into an authz.Caller, either
// with the Kubernetes TokenReview API (authentication.k8s.io/v1), the way
// Istio's CA authenticates ztunnel and istio-agent, or locally, as the
// API server's TokenReview would decide it.
//
// It owns: rejecting tokens that are obviously not JWTs without an API call;
// verifying token signatures against the keys the API server publishes for
// its service account issuer (IssuerKeys, /openid/v1/jwks), so that a token
// no key of the cluster signed is refused without a TokenReview, and, with
// local verification on, judging a pod-bound token whose signature verifies
// (issuer, audience, validity, service account UID, live pod) without one;
// asking the apiserver to verify every other token for our audiences
// (default istio-ca); checking the answer (authenticated, audience
// confirmed, a service account username) and reading the pod and node the
// token is bound to from the user extra; a bounded cache keyed by the
// token's SHA-256, trusted until the token's exp or MaxCacheTTL (whichever
// is first), rejections for NegativeTTL, and pod-bound entries only while
// PodChecker still sees the pod; one API call for concurrent requests with
// the same token, and fair queueing of TokenReviews; and CheckAccess, a
// startup check that we may create TokenReviews.
//
// Its Options are serve's flags of the token checks (verification mode,
// audiences, cache, key refresh), the same for every cluster; package
// authz/cluster builds each cluster's checks with them.
//
// It does not own: deciding which SPIFFE IDs a caller may get (package
// authz), the pod and service account indexes behind its interfaces
// (authz/podindex, authz/saindex), mapping errors to gRPC codes, rate
// limiting callers, or metrics registration (see Observer).
//
// The token itself is never stored or logged.
package tokenreview
