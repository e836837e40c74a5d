package tokenreview

import (
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"errors"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/authz"
)

const (
	testIssuer = "https://kubernetes.default.svc.cluster.local"
	webPodUID  = "0f8fad5b-d9cb-469f-a165-70867728950e"
	webSAUID   = "7d9b1c1e-3c47-4f3e-9a55-0d7b3c9b2a10"
)

// signClaims signs claims with the issuer's key kid (its id in the header).
func (is *issuer) signClaims(t *testing.T, kid string, claims map[string]any) string {
	t.Helper()
	is.mu.Lock()
	key := is.keys[kid]
	is.mu.Unlock()
	alg := jose.RS256
	if _, ok := key.(*ecdsa.PrivateKey); ok {
		alg = jose.ES256
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), kid))
	if err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := s.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (is *issuer) discovery(context.Context) ([]byte, error) {
	return []byte(`{"issuer":"` + testIssuer + `","jwks_uri":"https://127.0.0.1/openid/v1/jwks"}`), nil
}

// podClaims are the claims of apps/web's token bound to pod web-0 on
// node-a, as kube-apiserver 1.37 issues them, valid from now for an hour.
func podClaims(now time.Time) map[string]any {
	ref := func(name, uid string) map[string]any { return map[string]any{"name": name, "uid": uid} }
	return map[string]any{
		"iss": testIssuer, "aud": []string{"istio-ca"}, "sub": "system:serviceaccount:apps:web",
		"exp": now.Add(time.Hour).Unix(), "iat": now.Unix(), "nbf": now.Unix(),
		"jti": "9a1e7c7e-8f0e-4a7a-b0a4-3f3d0f0b6a61",
		"kubernetes.io": map[string]any{
			"namespace": "apps", "serviceaccount": ref("web", webSAUID), "pod": ref("web-0", webPodUID),
			"node": ref("node-a", "c1a0e7d0-5b5a-4b8e-9d7e-2a8f6f9a6b11"), "warnafter": now.Add(time.Hour).Unix(),
		},
	}
}

// with returns a copy of claims with path (top level, or "kubernetes.io/"
// + member) set to v, or removed if v is nil.
func with(claims map[string]any, path string, v any) map[string]any {
	out := map[string]any{}
	for k, val := range claims {
		out[k] = val
	}
	target := out
	if rest, ok := cutPrefix(path, "kubernetes.io/"); ok {
		k8s := map[string]any{}
		for k, val := range claims["kubernetes.io"].(map[string]any) {
			k8s[k] = val
		}
		out["kubernetes.io"] = k8s
		target, path = k8s, rest
	}
	if v == nil {
		delete(target, path)
	} else {
		target[path] = v
	}
	return out
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):], true
	}
	return s, false
}

// localFixture is a Reviewer verifying locally against an issuer, with a
// pod index holding web-0 and a service account index holding apps/web,
// over a fake API that accepts every token it is asked about.
type localFixture struct {
	r        *Reviewer
	is       *issuer
	api      *fakeAPI
	pods     *podSet
	accounts *accountSet
	obs      *countingObserver
	clock    *clocktesting.FakeClock
}

func newLocalFixture(t *testing.T) *localFixture {
	t.Helper()
	f := &localFixture{is: newIssuer(t, "k1"), api: newFakeAPI(always(podBound("apps", "web", "web-0", webPodUID, "node-a"))),
		pods:     &podSet{uids: map[string]bool{webPodUID: true}},
		accounts: &accountSet{}, obs: &countingObserver{},
		clock: clocktesting.NewFakeClock(time.Now().Truncate(time.Second))}
	f.accounts.set("apps/web", webSAUID)
	keys, err := NewIssuerKeys(IssuerKeysConfig{Fetch: f.is.fetch, FetchConfiguration: f.is.discovery, Clock: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	f.r = newReviewer(t, Config{Client: f.api.AuthenticationV1(), Keys: keys, Pods: f.pods, Accounts: f.accounts,
		Local: true, Observer: f.obs, Clock: f.clock})
	return f
}

// TestLocalVerification: each token, the answer TokenReview would give,
// and whether a TokenReview was made. For the tokens that only a
// TokenReview can judge, what matters is that the review was made: the
// fake API's answer is not the real one's.
func TestLocalVerification(t *testing.T) {
	tests := []struct {
		name     string
		claims   func(now time.Time) map[string]any
		setup    func(f *localFixture, now time.Time)
		wantErr  error // nil: authenticated
		reviewed bool
	}{
		{name: "pod-bound token of a live pod: accepted locally", claims: podClaims},
		// Validity is the API server's clock's call (a replica's clock
		// may be stepped): outside it by this clock, the token is reviewed.
		{name: "expired beyond the minute of leeway: reviewed", reviewed: true,
			claims: func(now time.Time) map[string]any {
				return with(podClaims(now), "exp", now.Add(-61*time.Second).Unix())
			}},
		{name: "expired within the leeway: accepted, as the API server does",
			claims: func(now time.Time) map[string]any {
				return with(podClaims(now), "exp", now.Add(-30*time.Second).Unix())
			}},
		{name: "not valid yet: reviewed", reviewed: true,
			claims: func(now time.Time) map[string]any { return with(podClaims(now), "nbf", now.Add(2*time.Minute).Unix()) }},
		{name: "issued in the future: reviewed", reviewed: true,
			claims: func(now time.Time) map[string]any { return with(podClaims(now), "iat", now.Add(2*time.Minute).Unix()) }},
		{name: "another audience: rejected", wantErr: authz.ErrUnauthenticated,
			claims: func(now time.Time) map[string]any { return with(podClaims(now), "aud", []string{"vault"}) }},
		{name: "another issuer: reviewed", reviewed: true,
			claims: func(now time.Time) map[string]any { return with(podClaims(now), "iss", "https://oidc.example.com") }},
		{name: "no audience (legacy): reviewed", reviewed: true,
			claims: func(now time.Time) map[string]any { return with(podClaims(now), "aud", nil) }},
		{name: "bound to a Secret: reviewed", reviewed: true,
			claims: func(now time.Time) map[string]any {
				c := with(podClaims(now), "kubernetes.io/pod", nil)
				return with(c, "kubernetes.io/secret", map[string]any{"name": "s", "uid": "u"})
			}},
		{name: "bound to a Node only: reviewed", reviewed: true,
			claims: func(now time.Time) map[string]any { return with(podClaims(now), "kubernetes.io/pod", nil) }},
		{name: "an unknown private claim: reviewed", reviewed: true,
			claims: func(now time.Time) map[string]any { return with(podClaims(now), "kubernetes.io/attestations", []any{}) }},
		{name: "service account created again (new uid): reviewed", claims: podClaims, reviewed: true,
			setup: func(f *localFixture, _ time.Time) { f.accounts.set("apps/web", "another-uid") }},
		{name: "service account not in the index: reviewed", claims: podClaims, reviewed: true,
			setup: func(f *localFixture, _ time.Time) { f.accounts.set("apps/web", "") }},
		{name: "service account deleted over a minute ago: reviewed", claims: podClaims, reviewed: true,
			setup: func(f *localFixture, now time.Time) { f.accounts.markDeleted("apps/web", now.Add(-61*time.Second)) }},
		{name: "pod not in the index: reviewed", claims: podClaims, reviewed: true,
			setup: func(f *localFixture, _ time.Time) { f.pods.remove(webPodUID) }},
		{name: "pod deleted over a minute ago: reviewed", claims: podClaims, reviewed: true,
			setup: func(f *localFixture, now time.Time) { f.pods.markDeleted(webPodUID, now.Add(-61*time.Second)) }},
		{name: "pod terminating within the minute: accepted", claims: podClaims,
			setup: func(f *localFixture, now time.Time) { f.pods.markDeleted(webPodUID, now.Add(-30*time.Second)) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newLocalFixture(t)
			now := f.clock.Now()
			if tc.setup != nil {
				tc.setup(f, now)
			}
			c, err := f.r.Authenticate(t.Context(), f.is.signClaims(t, "k1", tc.claims(now)))
			if reviewed := f.api.calls.Load() > 0; reviewed != tc.reviewed {
				t.Fatalf("reviewed = %v, want %v", reviewed, tc.reviewed)
			}
			if tc.reviewed {
				return
			}
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("Authenticate() error = %v, want %v", err, tc.wantErr)
			}
			if err == nil {
				want := authz.Caller{Namespace: "apps", ServiceAccount: "web", PodName: "web-0", PodUID: webPodUID,
					NodeName: "node-a", ExpiresAt: time.Unix(tc.claims(now)["exp"].(int64), 0)}
				if c != want {
					t.Errorf("caller = %+v, want %+v", c, want)
				}
			}
		})
	}
}

// TestLocalVerificationForgedNeverReviewed: a token naming the issuer's
// key but signed by another is refused without a review.
func TestLocalVerificationForgedNeverReviewed(t *testing.T) {
	f := newLocalFixture(t)
	f.is.addKey(t, "k2", false)
	forged := f.is.signClaims(t, "k2", podClaims(f.clock.Now()))
	// Re-label the forgery with the listed key id.
	other := f.is.signClaims(t, "k1", podClaims(f.clock.Now()))
	forged = headerOf(other) + forged[len(headerOf(forged)):]
	if _, err := f.r.Authenticate(t.Context(), forged); !errors.Is(err, ErrForged) {
		t.Fatalf("error = %v, want ErrForged", err)
	}
	if n := f.api.calls.Load(); n != 0 {
		t.Errorf("TokenReviews = %d, want 0", n)
	}
}

func headerOf(token string) string {
	for i := range token {
		if token[i] == '.' {
			return token[:i]
		}
	}
	return token
}

// TestCachedAnswerFollowsBoundObjects: a token accepted locally stays
// accepted from the cache only while what it is bound to is: each change
// below makes the next request go to a TokenReview (here the fake API
// rejects, as the real one would).
func TestCachedAnswerFollowsBoundObjects(t *testing.T) {
	tests := []struct {
		name   string
		change func(f *localFixture)
	}{
		{"pod deleted", func(f *localFixture) { f.pods.remove(webPodUID) }},
		{"pod deleted over a minute ago", func(f *localFixture) { f.pods.markDeleted(webPodUID, f.clock.Now().Add(-61*time.Second)) }},
		{"service account created again", func(f *localFixture) { f.accounts.set("apps/web", "another-uid") }},
		{"service account deleted", func(f *localFixture) { f.accounts.set("apps/web", "") }},
		{"signing key no longer listed", func(f *localFixture) {
			f.is.mu.Lock()
			f.is.served = nil
			f.is.mu.Unlock()
			f.is.addKey(t, "k9", true)
			f.clock.Step(DefaultKeysMaxAge) // the keys are fetched again
			f.r.keys.(*IssuerKeys).refresh(t.Context())
		}},
		{"token expired beyond the leeway", func(f *localFixture) { f.clock.Step(time.Hour + 61*time.Second) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newLocalFixture(t)
			token := f.is.signClaims(t, "k1", podClaims(f.clock.Now()))
			for range 3 {
				if _, err := f.r.Authenticate(t.Context(), token); err != nil {
					t.Fatal(err)
				}
			}
			if f.obs.hits != 2 || f.api.calls.Load() != 0 {
				t.Fatalf("before the change: %d hits, %d reviews; want 2, 0", f.obs.hits, f.api.calls.Load())
			}
			tc.change(f)
			f.api.setRespond(always(rejected("the token's object is gone")))
			if _, err := f.r.Authenticate(t.Context(), token); err == nil {
				t.Fatal("accepted after the change")
			}
		})
	}
}

// TestConcurrentRequestsShareOneLocalCheck: a node agent's requests come
// eight at a time with one new token; they share one signature check and
// decision.
func TestConcurrentRequestsShareOneLocalCheck(t *testing.T) {
	f := newLocalFixture(t)
	token := f.is.signClaims(t, "k1", podClaims(f.clock.Now()))
	errs := make(chan error, 64)
	for range 64 {
		go func() { _, err := f.r.Authenticate(t.Context(), token); errs <- err }()
	}
	for range 64 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	f.obs.mu.Lock()
	defer f.obs.mu.Unlock()
	if got := f.obs.verdicts["accepted"]; got != 1 {
		t.Errorf("%d local decisions for one token, want 1", got)
	}
}

// A replica whose clock is stepped 10 minutes either way gives the API
// server's answer, not its clock's: a token its clock finds outside its
// validity is reviewed (here the API server accepts it), and a cached
// answer whose token has expired by the stepped clock is not trusted.
func TestClockStepLeavesValidityToTheAPIServer(t *testing.T) {
	for _, step := range []time.Duration{10 * time.Minute, -10 * time.Minute} {
		t.Run(step.String(), func(t *testing.T) {
			f := newLocalFixture(t)
			issuedAt := f.clock.Now()
			claims := podClaims(issuedAt)
			claims = with(claims, "exp", issuedAt.Add(5*time.Minute).Unix())
			tok := f.is.signClaims(t, "k1", claims)
			if _, err := f.r.Authenticate(t.Context(), tok); err != nil || f.api.calls.Load() != 0 {
				t.Fatalf("before the step: %v, %d TokenReviews; want accepted locally", err, f.api.calls.Load())
			}
			f.clock.Step(step)
			fresh := f.is.signClaims(t, "k1", podClaims(issuedAt))
			if _, err := f.r.Authenticate(t.Context(), fresh); err != nil {
				t.Fatalf("a token the API server just minted, on a replica %v off: %v", step, err)
			}
			if _, err := f.r.Authenticate(t.Context(), tok); err != nil {
				t.Fatalf("the cached token, on a replica %v off: %v", step, err)
			}
			// Ahead, the cached token has expired by this clock; behind,
			// the fresh one was issued in this clock's future: either way
			// one token is left to the API server.
			if got := f.api.calls.Load(); got != 1 {
				t.Errorf("%d TokenReviews after a step of %v, want 1", got, step)
			}
		})
	}
}
