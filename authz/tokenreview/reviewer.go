package tokenreview

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	DefaultReviewRate    = 50
	DefaultReviewBurst   = 100
	// DefaultMaxPending bounds the tokens waiting for a TokenReview; each
	// holds its token (about 1 KiB) until reviewed.
	DefaultMaxPending = 10000
	// DefaultMaxPendingPerFlow bounds the new tokens of one node (or one
	// service account) waiting for a TokenReview; a node agent presents
	// one token.
	DefaultMaxPendingPerFlow = 8
	// DefaultReviewWorkers is how many TokenReviews are in flight at most.
	DefaultReviewWorkers = 16
)

// PodChecker tells whether the pod a token is bound to still exists.
//
// The apiserver keeps accepting a deleted pod's token for a few seconds (it
// caches successful token checks), so a fresh review alone does not prove
// the pod is alive.
type PodChecker interface {
	// IndexedPod reports whether the local index holds a live pod with
	// this UID in namespace, and its deletionTimestamp (zero unless it is
	// terminating). It is consulted on every cache hit, so it must be
	// cheap; a false answer for a live pod (informer lag) only costs one
	// more review.
	IndexedPod(namespace, uid string) (deletion time.Time, ok bool)
	// Pod answers from the index and, on a miss, from a bounded live
	// lookup; it is consulted after every positive review of a pod-bound
	// token.
	Pod(ctx context.Context, namespace, name, uid string) (authz.PodInfo, bool, error)
}

// KeyChecker checks tokens against the service account issuer's published
// keys; *IssuerKeys is one.
type KeyChecker interface {
	// Verify returns the signed payload of a token a listed key verifies,
	// an error wrapping ErrForged for a token the issuer certainly did not
	// sign, or one wrapping errUnverified when only a TokenReview can tell.
	Verify(ctx context.Context, token string) (Verified, error)
	// AdmitUnverified returns nil if a token Verify could not verify may
	// go to a TokenReview, or an error wrapping ErrForged.
	AdmitUnverified(err error) error
	// Listed reports whether a key id is among the issuer's keys now.
	Listed(keyID string) bool
	// Issuer is the issuer the keys belong to ("" if unknown).
	Issuer() string
}

// Config configures a Reviewer. Zero fields take the defaults.
type Config struct {
	// Client makes the TokenReview calls, e.g. clientset.AuthenticationV1().
	// Its own client-side rate limit should be off: ReviewRate paces the
	// calls.
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
	// ReviewTimeout bounds one API call, however long its waiters wait.
	ReviewTimeout time.Duration
	// ReviewRate and ReviewBurst pace the TokenReview calls (per second;
	// default 50, burst 100). ReviewWorkers bounds the calls in flight
	// (default 16).
	ReviewRate    float64
	ReviewBurst   int
	ReviewWorkers int
	// MaxPending bounds the tokens waiting for a TokenReview, and
	// MaxPendingPerFlow those of one flow (a node, or a service account);
	// a new token beyond either is refused with authz.ErrOverloaded.
	MaxPending, MaxPendingPerFlow int
	// Pods, if set, rejects pod-bound tokens whose pod is gone and evicts
	// their cached results.
	Pods PodChecker
	// Keys, if set, refuses a token it finds forged without a TokenReview.
	Keys KeyChecker
	// Accounts, if set, evicts cached answers whose service account was
	// deleted or created again (a new UID).
	Accounts ServiceAccounts
	// Local decides pod-bound tokens of the issuer locally, without a
	// TokenReview (see Reviewer.decide); it needs Keys, Pods and
	// Accounts.
	Local bool
	// Observer, if set, receives cache and review counters.
	Observer Observer
	// Clock drives cache expiry and the review pacing. Default the real
	// clock.
	Clock clock.Clock
	// Logger receives debug records; it never sees a token. Default discard.
	Logger *slog.Logger
}

// Reviewer authenticates bearer tokens: locally when it can (Local),
// otherwise with the TokenReview API, caching results by token hash and
// collapsing concurrent reviews of one token.
type Reviewer struct {
	client    authnv1client.TokenReviewInterface
	audiences []string
	maxTTL    time.Duration
	negTTL    time.Duration
	pods      PodChecker
	keys      KeyChecker
	accounts  ServiceAccounts
	local     bool
	obs       Observer
	clock     clock.Clock
	log       *slog.Logger
	cache     *cache.LRUExpireCache // [sha256.Size]byte → *entry
	judging   singleflight.Group    // of new tokens, by hash
	queue     *reviewQueue
}

// entry is a cached answer: a caller and what it stays bound to, or a
// rejection wrapping authz.ErrUnauthenticated.
type entry struct {
	caller authz.Caller
	bound  binding
	err    error
}

// New returns a Reviewer for cfg.
func New(cfg Config) (*Reviewer, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("tokenreview: %w", err)
	}
	cfg.setDefaults()
	r := &Reviewer{
		client:    cfg.Client.TokenReviews(),
		audiences: cfg.Audiences,
		maxTTL:    cfg.MaxCacheTTL,
		negTTL:    cfg.NegativeTTL,
		pods:      cfg.Pods,
		keys:      cfg.Keys,
		accounts:  cfg.Accounts,
		local:     cfg.Local,
		obs:       cfg.Observer,
		clock:     cfg.Clock,
		log:       cfg.Logger,
		cache:     cache.NewLRUExpireCacheWithClock(cfg.CacheSize, cfg.Clock),
	}
	r.queue = newReviewQueue(queueConfig{timeout: cfg.ReviewTimeout, rate: cfg.ReviewRate, burst: cfg.ReviewBurst,
		maxPending: cfg.MaxPending, maxPerFlow: cfg.MaxPendingPerFlow, workers: cfg.ReviewWorkers, clock: cfg.Clock})
	return r, nil
}

func (c *Config) validate() error {
	switch {
	case c.Client == nil:
		return errors.New("client is required")
	case c.CacheSize < 0, c.ReviewTimeout < 0, c.ReviewRate < 0, c.ReviewBurst < 0, c.ReviewWorkers < 0,
		c.MaxPending < 0, c.MaxPendingPerFlow < 0:
		return errors.New("sizes, rates and timeouts must not be negative")
	case slices.Contains(c.Audiences, ""):
		return errors.New("audiences contain an empty string")
	case c.Local && (c.Keys == nil || c.Pods == nil || c.Accounts == nil):
		return errors.New("local verification needs Keys, Pods and Accounts")
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
	c.ReviewRate = orDefault(c.ReviewRate, DefaultReviewRate)
	c.ReviewBurst = orDefault(c.ReviewBurst, DefaultReviewBurst)
	c.ReviewWorkers = orDefault(c.ReviewWorkers, DefaultReviewWorkers)
	c.MaxPending = orDefault(c.MaxPending, DefaultMaxPending)
	c.MaxPendingPerFlow = orDefault(c.MaxPendingPerFlow, DefaultMaxPendingPerFlow)
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
// authz.ErrUnauthenticated (bad, rejected or wrong-audience token),
// authz.ErrOverloaded (too many new tokens wait for a review; come back
// later) or authz.ErrUnavailable (the API could not answer; fail closed).
// The error text is for the server's log; it never contains the token.
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
		var err error
		if e, err = r.authenticateNew(ctx, key, token); err != nil {
			return authz.Caller{}, err
		}
	}
	return e.caller, e.err
}

// authenticateNew decides a token the cache does not hold: refused if
// forged, decided locally if it can be, else by a TokenReview.
//
// Concurrent requests with one new token share one judgement (a cold start
// sends a node agent's eight requests at once): it goes on when the
// request that started it is cancelled, and each request waits for it as
// long as its own context allows.
func (r *Reviewer) authenticateNew(ctx context.Context, key [sha256.Size]byte, token string) (*entry, error) {
	deadline, _ := ctx.Deadline()
	ch := r.judging.DoChan(string(key[:]), func() (any, error) {
		return r.judge(context.WithoutCancel(ctx), key, token, deadline)
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Val.(*entry), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for the token's check: %w", authz.ErrUnavailable, context.Cause(ctx))
	}
}

// judge decides a new token (see authenticateNew); a TokenReview whose
// turn would come after deadline (if not zero) is refused.
func (r *Reviewer) judge(ctx context.Context, key [sha256.Size]byte, token string, deadline time.Time) (*entry, error) {
	if e, ok := r.cached(key); ok {
		return e, nil // judged by a flight that ended since this request's lookup
	}
	flow, keyID := unverifiedFlow, ""
	if r.keys != nil {
		v, err := r.keys.Verify(ctx, token)
		switch {
		case errors.Is(err, errUnverified):
			err = r.keys.AdmitUnverified(err)
		case err == nil:
			keyID = v.KeyID
			var e *entry
			var decided bool
			if e, decided, flow = r.decideLocally(ctx, key, v); decided {
				return e, nil
			}
		}
		if err != nil {
			r.obs.Forged()
			return nil, fmt.Errorf("%w: %w", authz.ErrUnauthenticated, err)
		}
	}
	return r.queue.wait(ctx, key, flow, deadline, func(ctx context.Context) (*entry, error) {
		return r.reviewAndStore(ctx, key, token, keyID)
	})
}

// decideLocally decides a token with a verified signature without a
// TokenReview when local verification is on and can tell, caching the
// answer. It returns the token's flow, its share of the TokenReviews,
// when it cannot.
func (r *Reviewer) decideLocally(ctx context.Context, key [sha256.Size]byte, v Verified) (e *entry, decided bool, flow string) {
	if !r.local {
		return nil, false, flowOf(v.Payload)
	}
	d := r.decide(v, r.keys.Issuer())
	r.obs.LocalDecision(d.verdict.String())
	r.logLocal(ctx, key, d)
	switch d.verdict {
	case verdictAccepted:
		e = &entry{caller: d.caller, bound: d.bound}
	case verdictRejected:
		e = &entry{err: fmt.Errorf("%w: %w", authz.ErrUnauthenticated, d.why)}
	default:
		return nil, false, d.flow
	}
	r.store(key, e)
	return e, true, ""
}

func (r *Reviewer) logLocal(ctx context.Context, key [sha256.Size]byte, d local) {
	if !r.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := []slog.Attr{slog.String("token_sha256", hex.EncodeToString(key[:6])), slog.String("verdict", d.verdict.String())}
	if d.why != nil {
		attrs = append(attrs, slog.String("why", d.why.Error()))
	} else {
		attrs = append(attrs, slog.String("caller", d.caller.String()), slog.String("node", d.caller.NodeName),
			slog.Time("expires", d.caller.ExpiresAt))
	}
	r.log.LogAttrs(ctx, slog.LevelDebug, "token verified locally", attrs...)
}

// Pending is the number of TokenReviews queued or in flight.
func (r *Reviewer) Pending() int { return r.queue.len() }

// cached returns a cached review unless the token has expired since or its
// pod is gone, in which case the entry is dropped.
func (r *Reviewer) cached(key [sha256.Size]byte) (*entry, bool) {
	v, ok := r.cache.Get(key)
	if !ok {
		return nil, false
	}
	e := v.(*entry)
	if e.err == nil && !r.stillValid(e) {
		r.cache.Remove(key)
		return nil, false
	}
	return e, true
}

// stillValid reports whether a cached caller may still be trusted: the
// token has not expired, and the objects it is bound to are as alive as
// the API server requires (boundAlive).
func (r *Reviewer) stillValid(e *entry) bool {
	now := r.clock.Now()
	if exp := e.caller.ExpiresAt; !exp.IsZero() && !now.Before(exp) {
		return false
	}
	return r.boundAlive(e.caller, e.bound, now) == nil
}

// store caches e for the time it may be trusted.
//
// A positive answer about a token not bound to a pod (bound to a Secret or
// a Node, or not bound at all) is not cached: nothing the CA watches tells
// when the API server stops accepting it, and the API server's own cache
// already keeps a success for 10s. Each request with such a token is a
// TokenReview, as it is for istiod, and the CA accepts it no longer than
// the API server does.
func (r *Reviewer) store(key [sha256.Size]byte, e *entry) {
	ttl := r.negTTL
	if e.err == nil {
		if e.caller.PodUID == "" {
			return
		}
		ttl = r.maxTTL
		if exp := e.caller.ExpiresAt; !exp.IsZero() {
			ttl = min(ttl, exp.Sub(r.clock.Now()))
		}
	}
	if ttl > 0 {
		r.cache.Add(key, e, ttl)
	}
}
