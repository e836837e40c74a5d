package tokenreview

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/apimachinery/pkg/util/cache"
	authnv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/authz"
)

// Defaults for Config's zero fields.
const (
	DefaultAudience      = "istio-ca"
	DefaultMaxCacheTTL   = 2 * time.Minute
	DefaultNegativeTTL   = 5 * time.Second
	DefaultCacheSize     = 65536
	DefaultReviewTimeout = 10 * time.Second
)

// PodChecker tells whether the pod a token is bound to still exists.
//
// The apiserver keeps accepting a deleted pod's token for a few seconds (it
// caches successful token checks), so a fresh review alone does not prove
// the pod is alive.
type PodChecker interface {
	// HasPod reports whether the local index holds a live pod with this
	// UID. It is consulted on every cache hit, so it must be cheap; a false
	// answer for a live pod (informer lag) only costs one more review.
	HasPod(uid string) bool
	// Pod answers from the index and, on a miss, from a bounded live
	// lookup; it is consulted after every positive review of a pod-bound
	// token.
	Pod(ctx context.Context, namespace, name, uid string) (authz.PodInfo, bool, error)
}

// SignatureChecker checks a token's signature before a TokenReview is
// spent on it; *IssuerKeys is one.
type SignatureChecker interface {
	// CheckSignature returns an error when the token is certainly not
	// signed by the cluster's service account issuer; nil when it is, or
	// when it cannot tell.
	CheckSignature(ctx context.Context, token string) error
}

// Config configures a Reviewer. Zero fields take the defaults.
type Config struct {
	// Client makes the TokenReview calls, e.g. clientset.AuthenticationV1().
	Client authnv1client.TokenReviewsGetter
	// Audiences we ask the apiserver to check; one must be confirmed.
	// Default [DefaultAudience].
	Audiences []string
	// MaxCacheTTL bounds how long a positive review is trusted; the token's
	// exp bounds it too. Negative disables positive caching.
	MaxCacheTTL time.Duration
	// NegativeTTL is how long a rejection is cached. Negative disables it.
	NegativeTTL time.Duration
	// CacheSize is the maximum number of cached reviews (LRU).
	CacheSize int
	// ReviewTimeout bounds one API call, even for requests without a deadline.
	ReviewTimeout time.Duration
	// Pods, if set, rejects pod-bound tokens whose pod is gone and evicts
	// their cached results.
	Pods PodChecker
	// Signatures, if set, refuses a token it finds forged without a
	// TokenReview.
	Signatures SignatureChecker
	// Observer, if set, receives cache and review counters.
	Observer Observer
	// Clock drives cache expiry. Default the real clock.
	Clock clock.PassiveClock
	// Logger receives debug records; it never sees a token. Default discard.
	Logger *slog.Logger
}

// Reviewer authenticates bearer tokens with the TokenReview API, caching
// results by token hash and collapsing concurrent reviews of one token.
type Reviewer struct {
	client    authnv1client.TokenReviewInterface
	audiences []string
	maxTTL    time.Duration
	negTTL    time.Duration
	timeout   time.Duration
	pods      PodChecker
	sigs      SignatureChecker
	obs       Observer
	clock     clock.PassiveClock
	log       *slog.Logger
	cache     *cache.LRUExpireCache // [sha256.Size]byte → *entry
	calls     singleflight.Group
}

// entry is a cached review: a caller, or a rejection wrapping
// authz.ErrUnauthenticated.
type entry struct {
	caller authz.Caller
	err    error
}

// errLeaderDeadline marks a shared review cut short by the deadline of the
// request that started it; a waiter with time left retries.
var errLeaderDeadline = errors.New("review stopped at the deadline of the request that started it")

// New returns a Reviewer for cfg.
func New(cfg Config) (*Reviewer, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("tokenreview: %w", err)
	}
	cfg.setDefaults()
	return &Reviewer{
		client:    cfg.Client.TokenReviews(),
		audiences: cfg.Audiences,
		maxTTL:    cfg.MaxCacheTTL,
		negTTL:    cfg.NegativeTTL,
		timeout:   cfg.ReviewTimeout,
		pods:      cfg.Pods,
		sigs:      cfg.Signatures,
		obs:       cfg.Observer,
		clock:     cfg.Clock,
		log:       cfg.Logger,
		cache:     cache.NewLRUExpireCacheWithClock(cfg.CacheSize, cfg.Clock),
	}, nil
}

func (c *Config) validate() error {
	switch {
	case c.Client == nil:
		return errors.New("client is required")
	case c.CacheSize < 0:
		return fmt.Errorf("CacheSize %d is negative", c.CacheSize)
	case c.ReviewTimeout < 0:
		return fmt.Errorf("ReviewTimeout %v is negative", c.ReviewTimeout)
	case slices.Contains(c.Audiences, ""):
		return errors.New("audiences contain an empty string")
	}
	return nil
}

func (c *Config) setDefaults() {
	c.Audiences = slices.Clone(c.Audiences)
	if len(c.Audiences) == 0 {
		c.Audiences = []string{DefaultAudience}
	}
	c.MaxCacheTTL = orDefault(c.MaxCacheTTL, DefaultMaxCacheTTL)
	c.NegativeTTL = orDefault(c.NegativeTTL, DefaultNegativeTTL)
	c.CacheSize = orDefault(c.CacheSize, DefaultCacheSize)
	c.ReviewTimeout = orDefault(c.ReviewTimeout, DefaultReviewTimeout)
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// orDefault is for numbers only: comparing interfaces could panic.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Authenticate returns the caller a bearer token authenticates. Errors wrap
// authz.ErrUnauthenticated (bad, rejected or wrong-audience token) or
// authz.ErrUnavailable (the API could not answer; fail closed). The error
// text is for the server's log; it never contains the token.
func (r *Reviewer) Authenticate(ctx context.Context, token string) (authz.Caller, error) {
	if token == "" || len(token) > maxTokenSize {
		return authz.Caller{}, fmt.Errorf("%w: %w", authz.ErrUnauthenticated, checkTokenShape(token))
	}
	key := sha256.Sum256([]byte(token))
	e, ok := r.cached(key)
	r.obs.CacheLookup(ok)
	if !ok {
		// Only tokens that passed this check are ever cached, so the hot
		// (cached) path skips the scan.
		if err := checkTokenShape(token); err != nil {
			return authz.Caller{}, fmt.Errorf("%w: %w", authz.ErrUnauthenticated, err)
		}
		if r.sigs != nil {
			if err := r.sigs.CheckSignature(ctx, token); err != nil {
				r.obs.Forged()
				return authz.Caller{}, fmt.Errorf("%w: %w", authz.ErrUnauthenticated, err)
			}
		}
		var err error
		if e, err = r.reviewShared(ctx, key, token); err != nil {
			return authz.Caller{}, err
		}
	}
	return e.caller, e.err
}

// cached returns a cached review unless the token has expired since or its
// pod is gone, in which case the entry is dropped.
func (r *Reviewer) cached(key [sha256.Size]byte) (*entry, bool) {
	v, ok := r.cache.Get(key)
	if !ok {
		return nil, false
	}
	e := v.(*entry)
	if e.err == nil && !r.stillValid(e.caller) {
		r.cache.Remove(key)
		return nil, false
	}
	return e, true
}

func (r *Reviewer) stillValid(c authz.Caller) bool {
	if !c.ExpiresAt.IsZero() && !r.clock.Now().Before(c.ExpiresAt) {
		return false
	}
	return c.PodUID == "" || r.pods == nil || r.pods.HasPod(c.PodUID)
}

// store caches e for the time it may be trusted.
func (r *Reviewer) store(key [sha256.Size]byte, e *entry) {
	ttl := r.negTTL
	if e.err == nil {
		ttl = r.maxTTL
		if exp := e.caller.ExpiresAt; !exp.IsZero() {
			ttl = min(ttl, exp.Sub(r.clock.Now()))
		}
	}
	if ttl > 0 {
		r.cache.Add(key, e, ttl)
	}
}
