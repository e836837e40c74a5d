package tokenreview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
)

// ErrForged is wrapped when a token is refused for its signature: not a
// JWS the API server could have signed, or not verifying with the key it
// names.
var ErrForged = errors.New("token signature does not verify with the service account issuer's keys")

// jwsAlgorithms are the asymmetric JOSE algorithms. The API server signs
// service account tokens with RS256 or ES256/384/512 (its own keys or an
// external signer's); a token in any other (HMAC, none) is not its.
var jwsAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA,
}

// Defaults of IssuerKeysConfig's zero fields.
const (
	DefaultKeysMaxAge     = time.Hour
	DefaultKeysMinRefresh = 30 * time.Second
	DefaultUnlistedRate   = 1.0
	DefaultUnlistedBurst  = 10
	keysFetchTimeout      = 5 * time.Second
)

// IssuerKeysConfig configures IssuerKeys. Fetch is required.
type IssuerKeysConfig struct {
	// Fetch returns the issuer's JSON Web Key Set, e.g. JWKSFetcher.
	Fetch func(ctx context.Context) ([]byte, error)
	// FetchConfiguration, if set, returns the issuer's OpenID discovery
	// document (e.g. DiscoveryFetcher), read with every fetch of the keys
	// for the issuer they belong to (Issuer). Tokens are verified locally
	// only against a known issuer.
	FetchConfiguration func(ctx context.Context) ([]byte, error)
	// MaxAge is how long fetched keys are used before they are fetched
	// again, in the background (default 1h); a token with a key id not
	// among them fetches them at once, at most every MinRefresh (default
	// 30s).
	MaxAge, MinRefresh time.Duration
	// UnlistedRate and UnlistedBurst bound how many tokens signed with a
	// key the issuer does not list still go to the TokenReview (default
	// 1/s, burst 10); beyond that they are refused. The API server may
	// verify with keys it does not publish (an external signer's keys kept
	// for tokens issued before a migration), while any forged token can
	// name an unlisted key. A negative rate sends none.
	UnlistedRate  float64
	UnlistedBurst int
	Clock         clock.PassiveClock
	Logger        *slog.Logger
}

// IssuerKeys checks service account token signatures against the public
// keys the API server publishes for its issuer (service account issuer
// discovery, /openid/v1/jwks; every service account may read them), so
// that a token no key of the cluster signed is refused without a
// TokenReview. Any peer can send JWT-shaped strings, and each one never
// seen before would otherwise cost an API call from the CA's budget.
//
// It never accepts a token: the TokenReview still decides every token it
// lets through (expiry, audience, revocation, the bound pod). While it has
// no keys (not fetched yet, the API unreachable, no permission) it lets
// every token through. A token that names a listed key but does not verify
// with it is refused; one signed with an unlisted key fetches the keys
// again (at most every MinRefresh) and then goes to the TokenReview at the
// bounded UnlistedRate. Checks of tokens with listed keys never wait for a
// fetch.
type IssuerKeys struct {
	cfg      IssuerKeysConfig
	set      atomic.Pointer[keySet]
	fetches  singleflight.Group
	unlisted *rate.Limiter

	mu      sync.Mutex
	triedAt time.Time // last fetch started
	tried   bool      // a fetch has completed, successfully or not
	lastErr string    // of the last failed fetch, logged once
}

// keySet is one fetch's keys, and the issuer they belong to.
type keySet struct {
	keys      []jose.JSONWebKey
	issuer    string
	fetchedAt time.Time
}

// NewIssuerKeys returns an IssuerKeys for cfg; it fetches on first use.
func NewIssuerKeys(cfg IssuerKeysConfig) (*IssuerKeys, error) {
	if cfg.Fetch == nil {
		return nil, errors.New("tokenreview: IssuerKeys needs Fetch")
	}
	cfg.MaxAge = orDefault(cfg.MaxAge, DefaultKeysMaxAge)
	cfg.MinRefresh = min(orDefault(cfg.MinRefresh, DefaultKeysMinRefresh), cfg.MaxAge)
	cfg.UnlistedRate = orDefault(cfg.UnlistedRate, DefaultUnlistedRate)
	cfg.UnlistedBurst = orDefault(cfg.UnlistedBurst, DefaultUnlistedBurst)
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	unlisted := rate.NewLimiter(rate.Limit(cfg.UnlistedRate), cfg.UnlistedBurst)
	if cfg.UnlistedRate < 0 {
		unlisted = rate.NewLimiter(0, 0)
	}
	return &IssuerKeys{cfg: cfg, unlisted: unlisted}, nil
}

// JWKSFetcher fetches the API server's service account issuer keys.
func JWKSFetcher(c rest.Interface) func(ctx context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		return c.Get().AbsPath("/openid/v1/jwks").DoRaw(ctx)
	}
}

// DiscoveryFetcher fetches the API server's service account issuer
// discovery document, which names the issuer (its first
// --service-account-issuer).
func DiscoveryFetcher(c rest.Interface) func(ctx context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		return c.Get().AbsPath("/.well-known/openid-configuration").DoRaw(ctx)
	}
}

// errUnverified is returned by Verify for a token it can neither verify
// nor refuse: there are no keys yet, or it names none of them.
var errUnverified = errors.New("token signed with no key the issuer lists")

// Verified is a token whose signature verifies with a key the issuer
// lists.
type Verified struct {
	// Payload is the signed payload (the JWT claims).
	Payload []byte
	// KeyID is the key id of the key that verified it.
	KeyID string
}

// Verify checks token against the issuer's listed keys. It returns the
// signed payload when a listed key verifies the token; an error wrapping
// ErrForged when the token is not a JWS in an asymmetric algorithm or
// names a listed key it does not verify with; and errUnverified when
// there are no keys or the token names none of them (only a TokenReview
// can tell then). A token with an unlisted key id fetches the keys again
// first, at most every MinRefresh.
func (k *IssuerKeys) Verify(ctx context.Context, token string) (Verified, error) {
	jws, err := jose.ParseSignedCompact(token, jwsAlgorithms)
	if err != nil {
		return Verified{}, fmt.Errorf("%w: %w", ErrForged, err)
	}
	if len(jws.Signatures) != 1 {
		return Verified{}, fmt.Errorf("%w: %d signatures", ErrForged, len(jws.Signatures))
	}
	kid := jws.Signatures[0].Header.KeyID
	set := k.keys(ctx)
	if set == nil {
		return Verified{}, errUnverified // no keys: the TokenReview decides
	}
	v, listed, ok := set.verify(jws, kid)
	if !ok && !listed && k.refreshDue() {
		// Signed with no listed key: the issuer may have a new one. (The
		// keys, once there, are never nil again.)
		k.refresh(ctx)
		v, listed, ok = k.set.Load().verify(jws, kid)
	}
	switch {
	case ok:
		return v, nil
	case listed:
		return Verified{}, ErrForged
	}
	return Verified{}, fmt.Errorf("%w: key id %q", errUnverified, kid)
}

// CheckSignature returns an error wrapping ErrForged when token is not a
// JWS in an asymmetric algorithm, names a listed key it does not verify
// with, or is signed by no listed key beyond UnlistedRate; nil when it
// verifies, or when it is left to the TokenReview.
func (k *IssuerKeys) CheckSignature(ctx context.Context, token string) error {
	_, err := k.Verify(ctx, token)
	if !errors.Is(err, errUnverified) {
		return err
	}
	return k.AdmitUnverified(err)
}

// AdmitUnverified decides what becomes of a token Verify could not verify
// (err wraps errUnverified): while there are no keys it goes to the
// TokenReview; signed with a key the issuer does not list, it goes there
// at UnlistedRate, and beyond that rate it is refused as forged.
func (k *IssuerKeys) AdmitUnverified(err error) error {
	if k.set.Load() == nil || k.unlisted.AllowN(k.cfg.Clock.Now(), 1) {
		return nil
	}
	return fmt.Errorf("%w: %w, and more such tokens came than are sent for review", ErrForged, err)
}

// Listed reports whether a key with this id is among the current keys. A
// token verified earlier with a key the issuer no longer lists is no
// longer trusted: the key was retired or revoked.
func (k *IssuerKeys) Listed(keyID string) bool {
	set := k.set.Load()
	if set == nil {
		return false
	}
	for _, key := range set.keys {
		if key.KeyID == keyID {
			return true
		}
	}
	return false
}

// Issuer is the service account issuer the keys belong to, from the API
// server's discovery document; "" while unknown (no FetchConfiguration,
// or not fetched yet).
func (k *IssuerKeys) Issuer() string {
	if set := k.set.Load(); set != nil {
		return set.issuer
	}
	return ""
}

// verify reports whether the token verifies with a key of s, and whether
// its key id is listed (a token without one: whether any key verifies).
func (s *keySet) verify(jws *jose.JSONWebSignature, kid string) (v Verified, listed, ok bool) {
	for _, key := range s.keys {
		if kid != "" && key.KeyID != kid {
			continue
		}
		if kid != "" {
			listed = true
		}
		if payload, err := jws.Verify(key.Key); err == nil {
			return Verified{Payload: payload, KeyID: key.KeyID}, true, true
		}
	}
	return Verified{}, listed, false
}

// keys returns the current keys, nil if there are none. It waits (as long
// as ctx allows) only for the first fetch; keys older than MaxAge are
// fetched again in the background while they serve.
func (k *IssuerKeys) keys(ctx context.Context) *keySet {
	set := k.set.Load()
	switch {
	case set == nil:
		k.mu.Lock()
		first := !k.tried
		k.mu.Unlock()
		if first {
			k.refresh(ctx)
		} else if k.refreshDue() {
			k.startFetch()
		}
		return k.set.Load()
	case k.cfg.Clock.Since(set.fetchedAt) >= k.cfg.MaxAge && k.refreshDue():
		k.startFetch()
	}
	return set
}

// refreshDue reports whether a fetch may start now (the last one started
// MinRefresh ago or more), and if so records that one starts.
func (k *IssuerKeys) refreshDue() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.cfg.Clock.Now()
	if !k.triedAt.IsZero() && now.Sub(k.triedAt) < k.cfg.MinRefresh {
		return false
	}
	k.triedAt = now
	return true
}

// Run fetches the keys every MaxAge until ctx ends, so that a key the
// issuer no longer lists stops being trusted within MaxAge even while
// every caller's answer is cached (Listed reads the last fetch). A failed
// fetch keeps the keys there were.
func (k *IssuerKeys) Run(ctx context.Context) error {
	t := time.NewTicker(k.cfg.MaxAge)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			k.refresh(ctx)
		}
	}
}

// Prefetch fetches the keys now, unless a fetch has completed already, and
// waits for it as long as ctx allows.
func (k *IssuerKeys) Prefetch(ctx context.Context) {
	k.mu.Lock()
	done := k.tried
	k.mu.Unlock()
	if !done {
		k.refresh(ctx)
	}
}

// refresh fetches the keys and waits for the fetch as long as ctx allows.
func (k *IssuerKeys) refresh(ctx context.Context) {
	select {
	case <-k.startFetch():
	case <-ctx.Done():
	}
}

// startFetch starts fetching the keys, unless a fetch runs already (one
// for all callers, whatever their contexts), and returns when it is done.
func (k *IssuerKeys) startFetch() <-chan singleflight.Result {
	k.mu.Lock()
	if k.triedAt.IsZero() {
		k.triedAt = k.cfg.Clock.Now()
	}
	k.mu.Unlock()
	return k.fetches.DoChan("jwks", func() (any, error) {
		k.fetch()
		return nil, nil
	})
}

// fetch replaces the keys with the issuer's; on failure it keeps the old
// ones and logs the failure once.
func (k *IssuerKeys) fetch() {
	ctx, cancel := context.WithTimeout(context.Background(), keysFetchTimeout)
	defer cancel()
	keys, err := k.fetchKeys(ctx)
	var issuer string
	if err == nil {
		issuer, err = k.fetchIssuer(ctx)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.tried = true
	if err != nil {
		if err.Error() != k.lastErr {
			k.cfg.Logger.Warn("cannot fetch the service account issuer's keys; tokens are checked by TokenReview alone meanwhile",
				"error", err.Error(), "retry_in", k.cfg.MinRefresh)
			k.lastErr = err.Error()
		}
		return
	}
	if k.lastErr != "" || k.set.Load() == nil {
		k.cfg.Logger.Info("fetched the service account issuer's keys", "keys", len(keys))
	}
	k.lastErr = ""
	k.set.Store(&keySet{keys: keys, issuer: issuer, fetchedAt: k.cfg.Clock.Now()})
}

// fetchIssuer reads the issuer from the discovery document; "" without
// FetchConfiguration.
func (k *IssuerKeys) fetchIssuer(ctx context.Context) (string, error) {
	if k.cfg.FetchConfiguration == nil {
		return "", nil
	}
	raw, err := k.cfg.FetchConfiguration(ctx)
	if err != nil {
		return "", fmt.Errorf("issuer discovery: %w", err)
	}
	var doc struct {
		Issuer string `json:"issuer"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return "", fmt.Errorf("issuer discovery: %w", err)
	}
	if doc.Issuer == "" {
		return "", errors.New("issuer discovery: the document names no issuer")
	}
	return doc.Issuer, nil
}

func (k *IssuerKeys) fetchKeys(ctx context.Context) ([]jose.JSONWebKey, error) {
	raw, err := k.cfg.Fetch(ctx)
	if err != nil {
		return nil, err
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(raw, &set); err != nil {
		return nil, fmt.Errorf("issuer keys: %w", err)
	}
	var keys []jose.JSONWebKey
	for _, key := range set.Keys {
		if key.Valid() && key.IsPublic() {
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("issuer keys: the key set holds no public key")
	}
	return keys, nil
}
