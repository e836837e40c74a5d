// Package tokenreview turns a bearer token into an authz.Caller with the
// Kubernetes TokenReview API (authentication.k8s.io/v1), the way Istio's CA
// authenticates ztunnel and istio-agent.
//
// It owns: rejecting tokens that are obviously not JWTs without an API call;
// asking the apiserver to verify a token for our audiences (default istio-ca);
// checking the answer (authenticated, audience confirmed, a service account
// username) and reading the pod and node the token is bound to from the user
// extra; a bounded cache keyed by the token's SHA-256, trusted until the
// token's exp or MaxCacheTTL (whichever is first), rejections for
// NegativeTTL, and pod-bound entries only while PodChecker still sees the
// pod; one API call for concurrent requests with the same token; and
// CheckAccess, a startup check that we may create TokenReviews.
//
// It does not own: verifying JWT signatures (the apiserver does; the exp
// claim is read unverified and only bounds the cache), deciding which SPIFFE
// IDs a caller may get (package authz), the pod index behind PodChecker
// (authz/podindex), mapping errors to gRPC codes, rate limiting callers, or
// metrics registration (see Observer).
//
// The token itself is never stored or logged.
package tokenreview
