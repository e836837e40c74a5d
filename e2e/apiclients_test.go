package e2e_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/e2e/cahost"
)

// TestLifecycleLeaseHeldThroughTokenStorm gives a CA's request path one
// Kubernetes API call a second and a lease it must renew within two
// seconds, then sends it four times more never-seen tokens at once than
// that rate reviews within the renew deadline (fewer than it reviews
// within its review timeout, 10 s): the TokenReviews queue behind the
// CA's own rate limit.
// The lease renewals must not queue behind them (Kubernetes' controllers
// give leader election a client of its own for this reason): the CA keeps
// leading throughout, the Lease is renewed during the storm, and every
// request is answered with its certificate once its token is reviewed.
func TestLifecycleLeaseHeldThroughTokenStorm(t *testing.T) {
	const storm = 8
	f := newLCFixture(t, "storm")
	tokens := f.ztunnels(t, storm)
	ca := f.start(t, "--token-verification", "tokenreview", "--kube-api-qps", "1", "--kube-api-burst", "1",
		"--leader-election-lease-duration", "3s", "--leader-election-renew-deadline", "2s",
		"--leader-election-retry-period", "500ms")
	if err := pollUntil(t, lcWait, func() (bool, error) { return isLeader(t.Context(), ca) }); err != nil {
		t.Fatalf("the CA never led: %v", err)
	}
	renewed := func() time.Time {
		t.Helper()
		l, err := f.s.cp.Client().CoordinationV1().Leases(f.ns).Get(t.Context(), lcLease, metav1.GetOptions{})
		if err != nil || l.Spec.RenewTime == nil {
			t.Fatalf("Lease: %v", err)
		}
		return l.Spec.RenewTime.Time
	}

	began := time.Now()
	errs := make([]error, storm)
	var wg sync.WaitGroup
	for i, tok := range tokens {
		wg.Go(func() {
			_, errs[i] = ca.Request(t.Context(), cahost.RequestArgs{Token: tok, Identity: id("istio-system", "ztunnel"), Timeout: time.Minute})
		})
	}
	// Renewals every half second while the reviews queue for about
	// `storm` seconds: the Lease's renew time passes the storm's start
	// within the renew deadline.
	if err := pollUntil(t, lcWait, func() (bool, error) { return renewed().After(began.Add(time.Second)), nil }); err != nil {
		t.Errorf("the Lease was not renewed during the storm: %v", err)
	}
	wg.Wait()
	took := time.Since(began)
	for i, err := range errs {
		if err != nil {
			t.Errorf("ztunnel %d: %v", i, err)
		}
	}
	if took < (storm-2)*time.Second {
		t.Errorf("the storm took %v: its TokenReviews did not queue behind --kube-api-qps 1, so it tested nothing", took)
	}
	if lost := logLines(ca, `"msg":"stopped leading"`); len(lost) > 0 {
		t.Errorf("the CA lost its lease during the storm:\n%s", strings.Join(lost, "\n"))
	}
	if ids := leaderIdentities(ca); len(ids) != 1 {
		t.Errorf("the CA started leading %d times (%v), want once", len(ids), ids)
	}
	t.Logf("%d tokens reviewed in %v", storm, took.Round(time.Millisecond))
}

// TestLifecycleForgedTokensCostNoReview sends a CA never-seen tokens with
// the API server's header and claims but another key's signature: each is
// refused (Unauthenticated) without a TokenReview, the CA having checked it
// against the service account issuer's keys (/openid/v1/jwks), in either
// verification mode. A genuine token is then reviewed once with
// --token-verification tokenreview, and verified locally by default.
func TestLifecycleForgedTokensCostNoReview(t *testing.T) {
	for _, mode := range []string{"tokenreview", "local"} {
		t.Run(mode, func(t *testing.T) {
			const forged = 10
			f := newLCFixture(t, "forged-"+mode)
			tokens := f.ztunnels(t, 1)
			ca := f.start(t, "--token-verification", mode)
			ztunnel := id("istio-system", "ztunnel")
			for range forged {
				_, err := ca.Request(t.Context(), cahost.RequestArgs{Token: foreignSignedJWT(t, tokens[0]), Identity: ztunnel})
				if got := cahost.Code(err); got != codes.Unauthenticated {
					t.Fatalf("a forged token: code %s, want Unauthenticated (err: %v)", got, err)
				}
			}
			samples, err := scrapeCA(t.Context(), ca)
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := samples.Sum(mForged); n != forged {
				t.Errorf("%s = %v, want %d", mForged, n, forged)
			}
			if n, _ := samples.Sum(mReviews); n != 0 {
				t.Errorf("%v TokenReviews for forged tokens, want none", n)
			}
			if _, err := ca.Request(t.Context(), cahost.RequestArgs{Token: tokens[0], Identity: ztunnel}); err != nil {
				t.Fatalf("the genuine token: %v", err)
			}
			if samples, err = scrapeCA(t.Context(), ca); err != nil {
				t.Fatal(err)
			}
			wantReviews, wantLocal := 1.0, 0.0
			if mode == "local" {
				wantReviews, wantLocal = 0, 1
			}
			if n, _ := samples.Sum(mReviews); n != wantReviews {
				t.Errorf("%v TokenReviews for the genuine token, want %v", n, wantReviews)
			}
			if n, _ := samples.Sum(mLocal, "verdict", "accepted"); n != wantLocal {
				t.Errorf("%v tokens accepted locally, want %v", n, wantLocal)
			}
		})
	}
}
