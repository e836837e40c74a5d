package tokenreview

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/internal/testwait"
)

// issuer is a service account issuer: its signing keys, and the JWKS it
// serves (which a test may change), counting fetches.
type issuer struct {
	mu      sync.Mutex
	keys    map[string]crypto.Signer // by kid
	served  []string                 // kids in the JWKS
	fetches int
	down    bool
}

func newIssuer(t *testing.T, kids ...string) *issuer {
	t.Helper()
	is := &issuer{keys: map[string]crypto.Signer{}}
	for _, kid := range kids {
		is.addKey(t, kid, true)
	}
	return is
}

func (is *issuer) addKey(t *testing.T, kid string, publish bool) {
	t.Helper()
	var key crypto.Signer
	var err error
	if len(is.keys)%2 == 0 {
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	} else {
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	if err != nil {
		t.Fatal(err)
	}
	is.mu.Lock()
	defer is.mu.Unlock()
	is.keys[kid] = key
	if publish {
		is.served = append(is.served, kid)
	}
}

func (is *issuer) publish(kid string) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.served = append(is.served, kid)
}

func (is *issuer) fetch(context.Context) ([]byte, error) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.fetches++
	if is.down {
		return nil, errors.New("the API server is unavailable")
	}
	var set jose.JSONWebKeySet
	for _, kid := range is.served {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: is.keys[kid].Public(), KeyID: kid, Use: "sig"})
	}
	return json.Marshal(set)
}

func (is *issuer) fetchCount() int {
	is.mu.Lock()
	defer is.mu.Unlock()
	return is.fetches
}

// sign returns a compact JWS of a token payload, signed by the issuer's key
// kid, with header key id headerKid.
func (is *issuer) sign(t *testing.T, kid, headerKid string) string {
	t.Helper()
	is.mu.Lock()
	key := is.keys[kid]
	is.mu.Unlock()
	alg := jose.RS256
	if _, ok := key.(*ecdsa.PrivateKey); ok {
		alg = jose.ES256
	}
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if headerKid != "" {
		opts = opts.WithHeader(jose.HeaderKey("kid"), headerKid)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := s.Sign([]byte(`{"sub":"system:serviceaccount:apps:web","aud":["istio-ca"]}`))
	if err != nil {
		t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestIssuerKeys(t *testing.T) {
	const rotation = "a new key of the issuer (rotation): fetched again, accepted"
	hs256, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte("a shared secret of 32 bytes!!!!!")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	hmacJWS, _ := hs256.Sign([]byte(`{"sub":"system:serviceaccount:apps:web"}`))
	hmacToken, _ := hmacJWS.CompactSerialize()

	tests := []struct {
		name        string
		setup       func(t *testing.T, is *issuer) string // returns the token
		wantForged  bool
		wantFetches int
	}{
		{name: "signed by the issuer's key its kid names", setup: func(t *testing.T, is *issuer) string { return is.sign(t, "k1", "k1") }, wantFetches: 1},
		{name: "signed by the issuer's second (ECDSA) key", setup: func(t *testing.T, is *issuer) string { return is.sign(t, "k2", "k2") }, wantFetches: 1},
		{name: "no kid: any key of the issuer", setup: func(t *testing.T, is *issuer) string { return is.sign(t, "k2", "") }, wantFetches: 1},
		{name: "another key under the issuer's kid", setup: func(t *testing.T, is *issuer) string {
			is.addKey(t, "stranger", false)
			return is.sign(t, "stranger", "k1")
		}, wantForged: true, wantFetches: 1},
		{name: "a kid the issuer does not list (its keys just fetched), none sent for review", setup: func(t *testing.T, is *issuer) string {
			is.addKey(t, "stranger", false)
			return is.sign(t, "stranger", "stranger")
		}, wantForged: true, wantFetches: 1},
		{name: "no kid and no listed key verifies, none sent for review", setup: func(t *testing.T, is *issuer) string {
			is.addKey(t, "stranger", false)
			return is.sign(t, "stranger", "")
		}, wantForged: true, wantFetches: 1},
		{name: rotation, setup: func(t *testing.T, is *issuer) string {
			is.addKey(t, "k3", false) // published after the first fetch
			return is.sign(t, "k3", "k3")
		}, wantFetches: 2},
		{name: "HMAC, which the API server never signs with", setup: func(*testing.T, *issuer) string { return hmacToken }, wantForged: true, wantFetches: 0},
		{name: "not a JWS", setup: func(*testing.T, *issuer) string { return "e30.e30.c2ln" }, wantForged: true, wantFetches: 0},
		{name: "keys unavailable: left to the TokenReview", setup: func(t *testing.T, is *issuer) string {
			is.down = true
			is.addKey(t, "stranger", false)
			return is.sign(t, "stranger", "stranger")
		}, wantFetches: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := newIssuer(t, "k1", "k2")
			token := tt.setup(t, is)
			clk := clocktesting.NewFakeClock(testEpoch())
			keys, err := NewIssuerKeys(IssuerKeysConfig{Fetch: is.fetch, Clock: clk, UnlistedRate: -1})
			if err != nil {
				t.Fatal(err)
			}
			if tt.name == rotation {
				// Keys fetched before the new one is published.
				if err := keys.CheckSignature(context.Background(), is.sign(t, "k1", "k1")); err != nil {
					t.Fatal(err)
				}
				is.publish("k3")
				clk.Step(DefaultKeysMinRefresh)
			}
			err = keys.CheckSignature(context.Background(), token)
			if got := errors.Is(err, ErrForged); got != tt.wantForged || (!tt.wantForged && err != nil) {
				t.Fatalf("CheckSignature() = %v, want forged %v", err, tt.wantForged)
			}
			if n := is.fetchCount(); n != tt.wantFetches {
				t.Errorf("%d fetches of the keys, want %d", n, tt.wantFetches)
			}
		})
	}
}

// Tokens with unknown key ids fetch the keys at most every MinRefresh, and
// go to the TokenReview at UnlistedRate; old keys are fetched again after
// MaxAge, in the background.
func TestIssuerKeysFetchBounds(t *testing.T) {
	is := newIssuer(t, "k1")
	is.addKey(t, "stranger", false)
	forged := is.sign(t, "stranger", "stranger")
	clk := clocktesting.NewFakeClock(testEpoch())
	keys, err := NewIssuerKeys(IssuerKeysConfig{Fetch: is.fetch, Clock: clk, MinRefresh: 30 * time.Second, MaxAge: time.Hour,
		UnlistedRate: 1, UnlistedBurst: 3})
	if err != nil {
		t.Fatal(err)
	}
	reviewed := 0
	for range 100 {
		switch err := keys.CheckSignature(context.Background(), forged); {
		case err == nil:
			reviewed++
		case !errors.Is(err, ErrForged):
			t.Fatalf("CheckSignature() = %v, want nil or ErrForged", err)
		}
	}
	if n := is.fetchCount(); n != 1 || reviewed != 3 {
		t.Fatalf("100 tokens of an unlisted key within MinRefresh: %d fetches and %d left to review, want 1 and the burst, 3", n, reviewed)
	}
	clk.Step(30 * time.Second)
	_ = keys.CheckSignature(context.Background(), forged)
	if n := is.fetchCount(); n != 2 {
		t.Fatalf("after MinRefresh: %d fetches, want 2", n)
	}
	good := is.sign(t, "k1", "k1")
	clk.Step(59 * time.Minute)
	_ = keys.CheckSignature(context.Background(), good)
	if n := is.fetchCount(); n != 2 {
		t.Fatalf("known key within MaxAge: %d fetches, want 2", n)
	}
	clk.Step(time.Minute)
	if err := keys.CheckSignature(context.Background(), good); err != nil {
		t.Fatalf("after MaxAge, with the old keys: %v", err)
	}
	testwait.Eventually(t, "the keys fetched again in the background", func() bool { return is.fetchCount() == 3 })
}

// A check of a token with a listed key never waits for a fetch, even one
// that hangs; a token of an unlisted key waits only as long as its context.
func TestIssuerKeysDoNotWaitForSlowFetch(t *testing.T) {
	is := newIssuer(t, "k1")
	is.addKey(t, "stranger", false)
	release := make(chan struct{})
	defer close(release)
	slow := false
	var mu sync.Mutex
	fetch := func(ctx context.Context) ([]byte, error) {
		mu.Lock()
		s := slow
		mu.Unlock()
		if s {
			<-release
		}
		return is.fetch(ctx)
	}
	keys, err := NewIssuerKeys(IssuerKeysConfig{Fetch: fetch, UnlistedRate: -1, MinRefresh: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	good := is.sign(t, "k1", "k1")
	if err := keys.CheckSignature(context.Background(), good); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	slow = true
	mu.Unlock()
	// An unlisted key starts a fetch that hangs; it gives up with its ctx.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := keys.CheckSignature(ctx, is.sign(t, "stranger", "stranger")); !errors.Is(err, ErrForged) {
		t.Fatalf("unlisted key during a hung fetch: %v, want ErrForged once its context ends", err)
	}
	done := make(chan error, 1)
	go func() { done <- keys.CheckSignature(context.Background(), good) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a token of a listed key waited for the hung fetch")
	}
}

// A token the issuer's keys refuse costs no TokenReview; one they accept
// is still reviewed.
func TestAuthenticateForgedTokenNoReview(t *testing.T) {
	is := newIssuer(t, "k1")
	is.addKey(t, "stranger", false)
	api := newFakeAPI(always(webPod()))
	obs := &countingObserver{}
	keys, err := NewIssuerKeys(IssuerKeysConfig{Fetch: is.fetch, Clock: clocktesting.NewFakeClock(testEpoch())})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Client: api.AuthenticationV1(), Keys: keys, Observer: obs, Clock: clocktesting.NewFakeClock(testEpoch())})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Authenticate(context.Background(), is.sign(t, "stranger", "k1")); !errors.Is(err, authz.ErrUnauthenticated) || !errors.Is(err, ErrForged) {
		t.Fatalf("forged token: %v, want ErrUnauthenticated for ErrForged", err)
	}
	if api.calls.Load() != 0 || obs.forged != 1 {
		t.Fatalf("forged token: %d TokenReviews, %d counted forged; want 0 and 1", api.calls.Load(), obs.forged)
	}
	if _, err := r.Authenticate(context.Background(), is.sign(t, "k1", "k1")); err != nil || api.calls.Load() != 1 {
		t.Fatalf("genuine token: %v after %d TokenReviews, want nil after 1", err, api.calls.Load())
	}
}

// No string but a token the issuer signed passes while its keys are known.
func FuzzCheckSignature(f *testing.F) {
	is := &issuer{keys: map[string]crypto.Signer{}}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	is.keys["k1"], is.served = key, []string{"k1"}
	keys, err := NewIssuerKeys(IssuerKeysConfig{Fetch: is.fetch, UnlistedRate: -1})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"e30.e30.c2ln", "eyJhbGciOiJFUzI1NiIsImtpZCI6ImsxIn0.e30.AAAA", "eyJhbGciOiJub25lIn0.e30.", "a.b.c", "..", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		if err := keys.CheckSignature(context.Background(), token); err == nil {
			t.Fatalf("CheckSignature(%q) = nil for a token the issuer never signed", token)
		}
	})
}

// TestIssuerKeysRunRefetches: with no token to prompt a fetch, Run fetches
// the keys every MaxAge, so a key the issuer stopped listing is no longer
// Listed (cached answers verified with it stop being trusted).
func TestIssuerKeysRunRefetches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := newIssuer(t, "k1")
		k, err := NewIssuerKeys(IssuerKeysConfig{Fetch: is.fetch, MaxAge: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		k.Prefetch(t.Context())
		if !k.Listed("k1") {
			t.Fatal("k1 not listed after the first fetch")
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- k.Run(ctx) }()
		is.mu.Lock()
		is.served = nil
		is.mu.Unlock()
		is.addKey(t, "k2", true)
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		if k.Listed("k1") || !k.Listed("k2") {
			t.Errorf("after MaxAge: k1 listed %v, k2 listed %v; want false, true", k.Listed("k1"), k.Listed("k2"))
		}
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}
