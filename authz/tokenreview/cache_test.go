package tokenreview

import (
	"errors"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	testclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/authz"
)

// cacheFixture is a reviewer on a fake clock with a scripted apiserver.
type cacheFixture struct {
	api   *fakeAPI
	clock *testclock.FakeClock
	obs   *countingObserver
	r     *Reviewer
}

func newCacheFixture(t *testing.T, respond respondFunc, cfg Config) *cacheFixture {
	f := &cacheFixture{api: newFakeAPI(respond), clock: testclock.NewFakeClock(testEpoch()), obs: &countingObserver{}}
	cfg.Client, cfg.Clock, cfg.Observer = f.api.AuthenticationV1(), f.clock, f.obs
	f.r = newReviewer(t, cfg)
	return f
}

// authenticate calls Authenticate and checks the API call count after it.
func (f *cacheFixture) authenticate(t *testing.T, token string, wantCalls int32) (authz.Caller, error) {
	t.Helper()
	c, err := f.r.Authenticate(t.Context(), token)
	if n := f.api.calls.Load(); n != wantCalls {
		t.Fatalf("after %v: API calls = %d, want %d", f.clock.Since(testEpoch()), n, wantCalls)
	}
	return c, err
}

func TestCacheHits(t *testing.T) {
	f := newCacheFixture(t, always(webPod()), Config{})
	token := tokenExpiringAt(t, testEpoch().Add(time.Hour))
	for range 10 {
		if _, err := f.authenticate(t, token, 1); err != nil {
			t.Fatal(err)
		}
	}
	if f.obs.hits != 9 || f.obs.misses != 1 || f.obs.results[ResultAuthenticated] != 1 {
		t.Fatalf("observer: hits %d misses %d results %v; want 9, 1, 1 authenticated",
			f.obs.hits, f.obs.misses, f.obs.results)
	}
}

func TestCacheExpiry(t *testing.T) {
	tests := []struct {
		name        string
		exp         time.Duration // token exp after the first review; 0: no exp claim
		maxTTL      time.Duration
		lastCached  time.Duration // last moment still served from the cache
		firstReview time.Duration // first moment reviewed again
	}{
		{"MaxCacheTTL before exp", time.Hour, 2 * time.Minute, 2 * time.Minute, 2*time.Minute + time.Nanosecond},
		{"exp before MaxCacheTTL", 30 * time.Second, 2 * time.Minute, 30*time.Second - time.Nanosecond, 30 * time.Second},
		{"no exp claim", 0, time.Minute, time.Minute, time.Minute + time.Nanosecond},
		{"default MaxCacheTTL", time.Hour, 0, DefaultMaxCacheTTL, DefaultMaxCacheTTL + time.Nanosecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newCacheFixture(t, always(webPod()), Config{MaxCacheTTL: tc.maxTTL})
			token := makeJWT(t, map[string]any{"sub": "x"})
			if tc.exp != 0 {
				token = tokenExpiringAt(t, testEpoch().Add(tc.exp))
			}
			_, _ = f.authenticate(t, token, 1)
			f.clock.SetTime(testEpoch().Add(tc.lastCached))
			_, _ = f.authenticate(t, token, 1)
			f.clock.SetTime(testEpoch().Add(tc.firstReview))
			_, _ = f.authenticate(t, token, 2)
		})
	}
}

func TestExpiredTokenNeverCached(t *testing.T) {
	// The apiserver accepted it (clock skew), but by our clock it has expired.
	f := newCacheFixture(t, always(webPod()), Config{})
	token := tokenExpiringAt(t, testEpoch().Add(-time.Second))
	for i := range int32(3) {
		if _, err := f.authenticate(t, token, i+1); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNegativeCache(t *testing.T) {
	f := newCacheFixture(t, always(rejected("token has expired")), Config{NegativeTTL: 5 * time.Second})
	token := tokenExpiringAt(t, testEpoch().Add(time.Hour))
	_, err1 := f.authenticate(t, token, 1)
	f.clock.Step(5 * time.Second)
	_, err2 := f.authenticate(t, token, 1)
	for _, err := range []error{err1, err2} {
		if !errors.Is(err, authz.ErrUnauthenticated) {
			t.Fatalf("error = %v, want ErrUnauthenticated", err)
		}
	}
	f.clock.Step(time.Nanosecond)
	_, _ = f.authenticate(t, token, 2)
}

func TestNegativeCacheDisabled(t *testing.T) {
	f := newCacheFixture(t, always(rejected("no")), Config{NegativeTTL: -1})
	token := tokenExpiringAt(t, testEpoch().Add(time.Hour))
	_, _ = f.authenticate(t, token, 1)
	_, _ = f.authenticate(t, token, 2)
}

func TestAPIErrorNotCached(t *testing.T) {
	respond := func(n int) (authnv1.TokenReviewStatus, error) {
		if n == 1 {
			return authnv1.TokenReviewStatus{}, apierrors.NewTooManyRequests("slow down", 1)
		}
		return webPod(), nil
	}
	f := newCacheFixture(t, respond, Config{})
	token := tokenExpiringAt(t, testEpoch().Add(time.Hour))
	if _, err := f.authenticate(t, token, 1); !errors.Is(err, authz.ErrUnavailable) {
		t.Fatalf("first call error = %v, want ErrUnavailable", err)
	}
	if _, err := f.authenticate(t, token, 2); err != nil {
		t.Fatalf("second call: %v", err)
	}
	if f.obs.results[ResultError] != 1 || f.obs.results[ResultAuthenticated] != 1 {
		t.Fatalf("observer results = %v", f.obs.results)
	}
}

func TestPodGoneReReviews(t *testing.T) {
	respond := func(n int) (authnv1.TokenReviewStatus, error) {
		if n == 1 {
			return webPod(), nil
		}
		return rejected("pod has been deleted"), nil
	}
	pods := &podSet{uids: map[string]bool{"uid-web-0": true}}
	f := newCacheFixture(t, respond, Config{Pods: pods})
	token := tokenExpiringAt(t, testEpoch().Add(time.Hour))
	_, _ = f.authenticate(t, token, 1)
	if _, err := f.authenticate(t, token, 1); err != nil {
		t.Fatalf("cached call while the pod exists: %v", err)
	}
	pods.remove("uid-web-0")
	if _, err := f.authenticate(t, token, 2); !errors.Is(err, authz.ErrUnauthenticated) {
		t.Fatalf("after pod deletion: error = %v, want ErrUnauthenticated", err)
	}
}

// The apiserver caches successful token checks for seconds, so it may still
// accept the token of a pod deleted a moment ago: the pod check must reject
// it on a fresh review, and cache the rejection.
func TestPodGoneRejectedEvenWhenTheAPIAccepts(t *testing.T) {
	pods := &podSet{uids: map[string]bool{"uid-web-0": true}}
	f := newCacheFixture(t, always(webPod()), Config{Pods: pods})
	token := tokenExpiringAt(t, testEpoch().Add(time.Hour))
	if _, err := f.authenticate(t, token, 1); err != nil {
		t.Fatalf("while the pod exists: %v", err)
	}
	pods.remove("uid-web-0")
	if _, err := f.authenticate(t, token, 2); !errors.Is(err, authz.ErrUnauthenticated) {
		t.Fatalf("after pod deletion: error = %v, want ErrUnauthenticated", err)
	}
	if _, err := f.authenticate(t, token, 2); !errors.Is(err, authz.ErrUnauthenticated) {
		t.Fatalf("rejection not cached: error = %v", err)
	}
	if f.obs.results[ResultPodGone] != 1 {
		t.Fatalf("observer results = %v, want one %s", f.obs.results, ResultPodGone)
	}
}

// TestTokensNotBoundToAPodAreNotCached: the CA cannot tell when a Secret-
// or Node-bound token stops being valid, so each request with one is
// reviewed again (the API server caches its own answer for 10s); the pod
// index has no say in it.
func TestTokensNotBoundToAPodAreNotCached(t *testing.T) {
	st := webPod()
	st.User.Extra = map[string]authnv1.ExtraValue{extraNodeName: {"node-a"}} // a Node-bound token
	f := newCacheFixture(t, always(st), Config{Pods: &podSet{}})
	token := tokenExpiringAt(t, testEpoch().Add(time.Hour))
	if _, err := f.authenticate(t, token, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := f.authenticate(t, token, 2); err != nil {
		t.Fatal(err)
	}
}

func TestCacheSizeBound(t *testing.T) {
	f := newCacheFixture(t, always(webPod()), Config{CacheSize: 2})
	tokens := make([]string, 3)
	for i := range tokens {
		tokens[i] = tokenExpiringAt(t, testEpoch().Add(time.Duration(i+1)*time.Hour))
		_, _ = f.authenticate(t, tokens[i], int32(i+1))
	}
	_, _ = f.authenticate(t, tokens[2], 3) // most recent: cached
	_, _ = f.authenticate(t, tokens[0], 4) // least recent: evicted
}
