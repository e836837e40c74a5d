package tokenreview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
)

// ErrForged is wrapped when a token's signature verifies with none of the
// issuer's keys: the API server would reject it too.
var ErrForged = errors.New("token signature does not verify with any key of the service account issuer")

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
	keysFetchTimeout      = 5 * time.Second
)

// IssuerKeysConfig configures IssuerKeys. Fetch is required.
type IssuerKeysConfig struct {
	// Fetch returns the issuer's JSON Web Key Set, e.g. JWKSFetcher.
	Fetch func(ctx context.Context) ([]byte, error)
	// MaxAge is how long fetched keys are used before they are fetched
	// again (default 1h); a token signed by a key not among them fetches
	// them at once, at most every MinRefresh (default 30s).
	MaxAge, MinRefresh time.Duration
	Clock              clock.PassiveClock
	Logger             *slog.Logger
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
// every token through. A token with a key id it does not know fetches the
// keys again, at most every MinRefresh: right after a fetch, a token
// signed by a key the issuer has only just added is refused until the
// next one (the caller retries), and forged key ids cost one fetch per
// MinRefresh, whatever their number.
type IssuerKeys struct {
	cfg IssuerKeysConfig

	mu        sync.Mutex
	keys      []jose.JSONWebKey
	fetchedAt time.Time // of keys
	triedAt   time.Time // last fetch, successful or not
	lastErr   string    // of the last failed fetch, logged once
}

// NewIssuerKeys returns an IssuerKeys for cfg; it fetches on first use.
func NewIssuerKeys(cfg IssuerKeysConfig) (*IssuerKeys, error) {
	if cfg.Fetch == nil {
		return nil, errors.New("tokenreview: IssuerKeys needs Fetch")
	}
	cfg.MaxAge = orDefault(cfg.MaxAge, DefaultKeysMaxAge)
	cfg.MinRefresh = orDefault(cfg.MinRefresh, DefaultKeysMinRefresh)
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &IssuerKeys{cfg: cfg}, nil
}

// JWKSFetcher fetches the API server's service account issuer keys.
func JWKSFetcher(c rest.Interface) func(ctx context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		return c.Get().AbsPath("/openid/v1/jwks").DoRaw(ctx)
	}
}

// CheckSignature returns an error wrapping ErrForged when token is not a
// JWS in an asymmetric algorithm, or its signature verifies with none of
// the issuer's keys; nil when it verifies, or when there are no keys to
// tell.
func (k *IssuerKeys) CheckSignature(ctx context.Context, token string) error {
	jws, err := jose.ParseSignedCompact(token, jwsAlgorithms)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrForged, err)
	}
	if len(jws.Signatures) != 1 {
		return fmt.Errorf("%w: %d signatures", ErrForged, len(jws.Signatures))
	}
	kid := jws.Signatures[0].Header.KeyID
	keys, ok := k.keysFor(ctx, kid, false)
	if !ok {
		return nil // no keys: the TokenReview decides
	}
	if len(keys) == 0 {
		// A key id we do not know: the issuer may have a new key.
		if keys, _ = k.keysFor(ctx, kid, true); len(keys) == 0 {
			return fmt.Errorf("%w: no key with id %q", ErrForged, kid)
		}
	}
	for _, key := range keys {
		if _, err := jws.Verify(key.Key); err == nil {
			return nil
		}
	}
	return ErrForged
}

// keysFor returns the keys a token with key id kid may be signed with
// (every key when kid is empty), fetching them when they are missing or
// old, or when refresh is set and the last fetch is MinRefresh ago. ok is
// false when no keys were ever fetched.
func (k *IssuerKeys) keysFor(ctx context.Context, kid string, refresh bool) (keys []jose.JSONWebKey, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.cfg.Clock.Now()
	stale := k.keys == nil || now.Sub(k.fetchedAt) >= k.cfg.MaxAge || refresh
	if stale && now.Sub(k.triedAt) >= k.cfg.MinRefresh {
		k.fetch(ctx, now)
	}
	if k.keys == nil {
		return nil, false
	}
	for _, key := range k.keys {
		if kid == "" || key.KeyID == kid {
			keys = append(keys, key)
		}
	}
	return keys, true
}

// fetch replaces the keys with the issuer's; on failure it keeps the old
// ones and logs the failure once. Callers hold mu.
func (k *IssuerKeys) fetch(ctx context.Context, now time.Time) {
	k.triedAt = now
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keysFetchTimeout)
	defer cancel()
	keys, err := k.fetchKeys(ctx)
	if err != nil {
		if err.Error() != k.lastErr {
			k.cfg.Logger.Warn("cannot fetch the service account issuer's keys; tokens are checked by TokenReview alone",
				"error", err.Error(), "retry_in", k.cfg.MinRefresh)
			k.lastErr = err.Error()
		}
		return
	}
	if k.lastErr != "" || k.keys == nil {
		k.cfg.Logger.Info("fetched the service account issuer's keys", "keys", len(keys))
	}
	k.keys, k.fetchedAt, k.lastErr = keys, now, ""
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
