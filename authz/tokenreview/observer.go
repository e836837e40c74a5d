package tokenreview

import "time"

// Observer receives counters for metrics. Implementations must be safe for
// concurrent use and fast: they are called on the request path.
type Observer interface {
	// CacheLookup is called once per well-formed token that reaches the cache.
	CacheLookup(hit bool)
	// ReviewDone is called after each TokenReview API call with one of the
	// Result* values (a bounded set, safe as a metric label).
	ReviewDone(result string, d time.Duration)
	// Forged is called for each token refused, without a TokenReview,
	// because its signature verifies with no key of the issuer.
	Forged()
	// LocalDecision is called for each new token with a verified signature
	// under local verification, with its verdict: accepted, rejected, or
	// undecided (a TokenReview decides).
	LocalDecision(verdict string)
}

// Results of one TokenReview, as passed to Observer.ReviewDone.
const (
	ResultAuthenticated     = "authenticated"
	ResultNotAuthenticated  = "not-authenticated"
	ResultAudienceMismatch  = "audience-mismatch"
	ResultNotServiceAccount = "not-service-account"
	ResultInvalidUserInfo   = "invalid-user-info"
	ResultPodGone           = "pod-gone"
	ResultError             = "error"
)

type nopObserver struct{}

func (nopObserver) CacheLookup(bool)                 {}
func (nopObserver) ReviewDone(string, time.Duration) {}
func (nopObserver) Forged()                          {}
func (nopObserver) LocalDecision(string)             {}
