package tokenreview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/authz"
)

// blockingAPI is a TokenReview client that, unlike the fake clientset,
// honours ctx: each call waits for release or for its context to end.
type blockingAPI struct {
	release   chan struct{}
	calls     atomic.Int32
	mu        sync.Mutex
	deadlines []time.Time // of each call's context; zero if none
}

func newBlockingAPI() *blockingAPI { return &blockingAPI{release: make(chan struct{})} }

func (b *blockingAPI) TokenReviews() authnv1client.TokenReviewInterface { return b }

func (b *blockingAPI) Create(
	ctx context.Context, tr *authnv1.TokenReview, _ metav1.CreateOptions,
) (*authnv1.TokenReview, error) {
	b.calls.Add(1)
	d, _ := ctx.Deadline()
	b.mu.Lock()
	b.deadlines = append(b.deadlines, d)
	b.mu.Unlock()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.release:
		resp := tr.DeepCopy()
		resp.Status = webPod()
		return resp, nil
	}
}

type result struct {
	caller authz.Caller
	err    error
}

func authenticateAsync(ctx context.Context, r *Reviewer, token string, out chan<- result) {
	go func() {
		c, err := r.Authenticate(ctx, token)
		out <- result{c, err}
	}()
}

func wantWebPod(t *testing.T, res result) {
	t.Helper()
	if res.err != nil {
		t.Fatalf("Authenticate: %v", res.err)
	}
	if want := "apps/web (pod web-0)"; res.caller.String() != want {
		t.Fatalf("caller = %v, want %s", res.caller, want)
	}
}

// gatedClient holds every TokenReview call until release is closed, outside
// the fake clientset (whose reactors run under one lock), so extra calls would
// be counted rather than deadlock.
type gatedClient struct {
	authnv1client.TokenReviewInterface
	release chan struct{}
}

func (g gatedClient) TokenReviews() authnv1client.TokenReviewInterface { return g }

func (g gatedClient) Create(
	ctx context.Context, tr *authnv1.TokenReview, o metav1.CreateOptions,
) (*authnv1.TokenReview, error) {
	<-g.release
	return g.TokenReviewInterface.Create(ctx, tr, o)
}

func TestConcurrentCallsShareOneReview(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(always(webPod()))
		gate := gatedClient{api.AuthenticationV1().TokenReviews(), make(chan struct{})}
		r := newReviewer(t, Config{Client: gate})
		token := tokenExpiringAt(t, time.Now().Add(time.Hour))
		out := make(chan result, 64)
		for range 64 {
			authenticateAsync(t.Context(), r, token, out)
		}
		synctest.Wait() // all 64 are waiting: one in the API call, the rest on it
		close(gate.release)
		for range 64 {
			wantWebPod(t, <-out)
		}
		if n := api.calls.Load(); n != 1 {
			t.Fatalf("API calls = %d, want 1", n)
		}
	})
}

func TestLeaderCancelledFollowersGetResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newBlockingAPI()
		r := newReviewer(t, Config{Client: api})
		token := tokenExpiringAt(t, time.Now().Add(time.Hour))
		leaderCtx, cancel := context.WithCancel(t.Context())
		leader, followers := make(chan result, 1), make(chan result, 3)
		authenticateAsync(leaderCtx, r, token, leader)
		synctest.Wait() // the leader's call is in flight
		for range 3 {
			authenticateAsync(t.Context(), r, token, followers)
		}
		synctest.Wait()
		cancel()
		if res := <-leader; !errors.Is(res.err, authz.ErrUnavailable) || !errors.Is(res.err, context.Canceled) {
			t.Fatalf("leader error = %v, want ErrUnavailable and context.Canceled", res.err)
		}
		close(api.release)
		for range 3 {
			wantWebPod(t, <-followers)
		}
		if n := api.calls.Load(); n != 1 {
			t.Fatalf("API calls = %d, want 1", n)
		}
	})
}

// TestReviewOutlivesItsWaiters: a caller whose deadline passes while its
// token is reviewed gets Unavailable, but the review goes on, its answer
// is cached, and the caller's retry is a cache hit.
func TestReviewOutlivesItsWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newBlockingAPI()
		obs := &countingObserver{}
		r := newReviewer(t, Config{Client: api, Observer: obs})
		token := tokenExpiringAt(t, time.Now().Add(time.Hour))
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if _, err := r.Authenticate(ctx, token); !errors.Is(err, authz.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error = %v, want ErrUnavailable and DeadlineExceeded", err)
		}
		synctest.Wait() // the review is still in flight, with no waiter
		if r.Pending() != 1 {
			t.Fatalf("Pending() = %d after the waiter left, want 1", r.Pending())
		}
		close(api.release)
		synctest.Wait()
		res := make(chan result, 1)
		authenticateAsync(t.Context(), r, token, res)
		wantWebPod(t, <-res)
		if n := api.calls.Load(); n != 1 {
			t.Fatalf("API calls = %d, want 1: the retry should be a cache hit", n)
		}
		if obs.hits != 1 {
			t.Errorf("cache hits = %d, want 1", obs.hits)
		}
	})
}

// TestReviewTimeoutBoundsAPICall: the API call has the review timeout of
// its own, whatever deadline its waiters have.
func TestReviewTimeoutBoundsAPICall(t *testing.T) {
	tests := []struct {
		name          string
		reqTimeout    time.Duration // 0: no deadline on the request
		reviewTimeout time.Duration
		wantReturn    time.Duration // Authenticate returned, from the start
		wantCall      time.Duration // API call's deadline, from the start
	}{
		{"a request deadline does not shorten the call", 3 * time.Second, 0, 3 * time.Second, DefaultReviewTimeout},
		{"review timeout without a request deadline", 0, 0, DefaultReviewTimeout, DefaultReviewTimeout},
		{"review timeout before the request deadline", time.Minute, 2 * time.Second, 2 * time.Second, 2 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				api := newBlockingAPI() // never released
				r := newReviewer(t, Config{Client: api, ReviewTimeout: tc.reviewTimeout})
				ctx := t.Context()
				if tc.reqTimeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.reqTimeout)
					defer cancel()
				}
				start := time.Now()
				_, err := r.Authenticate(ctx, tokenExpiringAt(t, start.Add(time.Hour)))
				if !errors.Is(err, authz.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("error = %v, want ErrUnavailable and DeadlineExceeded", err)
				}
				if got := time.Since(start); got != tc.wantReturn {
					t.Errorf("Authenticate returned after %v, want %v", got, tc.wantReturn)
				}
				time.Sleep(time.Hour) // the call ends at its own deadline
				synctest.Wait()
				if diff := cmp.Diff([]time.Time{start.Add(tc.wantCall)}, api.deadlines); diff != "" {
					t.Errorf("API call deadlines (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// nodeToken is a token of the issuer bound to a pod on node (its flow),
// told apart by n.
func nodeToken(t *testing.T, is *issuer, node string, n int) string {
	t.Helper()
	c := with(podClaims(time.Now()), "kubernetes.io/node", map[string]any{"name": node, "uid": "u-" + node})
	return is.signClaims(t, "k1", with(c, "jti", fmt.Sprintf("%s-%d", node, n)))
}

// orderedAPI is a TokenReview client that answers in turn, recording the
// tokens it was asked about in order.
type orderedAPI struct {
	mu     sync.Mutex
	tokens []string
}

func (o *orderedAPI) TokenReviews() authnv1client.TokenReviewInterface { return o }

func (o *orderedAPI) Create(_ context.Context, tr *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	o.mu.Lock()
	o.tokens = append(o.tokens, tr.Spec.Token)
	o.mu.Unlock()
	resp := tr.DeepCopy()
	resp.Status = webPod()
	return resp, nil
}

// TestReviewsShareFairlyBetweenFlows: node-a presents six new tokens, then
// node-b one; at one review a second, node-b's is reviewed after at most
// one more of node-a's (besides the one in flight when it came), not
// after all of them.
func TestReviewsShareFairlyBetweenFlows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := newIssuer(t, "k1")
		keys, err := NewIssuerKeys(IssuerKeysConfig{Fetch: is.fetch})
		if err != nil {
			t.Fatal(err)
		}
		api := &orderedAPI{}
		clk := clocktesting.NewFakeClock(time.Now())
		r := newReviewer(t, Config{Client: api, Keys: keys, Clock: clk, ReviewRate: 1, ReviewBurst: 1, ReviewWorkers: 1})
		var tokens []string
		for n := range 6 {
			tokens = append(tokens, nodeToken(t, is, "node-a", n))
		}
		tokens = append(tokens, nodeToken(t, is, "node-b", 0))
		out := make(chan result, len(tokens))
		for _, tok := range tokens {
			authenticateAsync(t.Context(), r, tok, out)
			synctest.Wait() // queued in this order
		}
		for range tokens {
			clk.Step(time.Second)
			synctest.Wait()
		}
		for range tokens {
			<-out
		}
		// The first two of node-a's were reviewed or in flight when
		// node-b's came.
		pos := slices.Index(api.tokens, tokens[6])
		if pos < 0 || pos > 3 {
			t.Errorf("node-b's token was review number %d of %d, want at most 4", pos+1, len(api.tokens))
		}
	})
}

// TestReviewQueueRefuses: beyond its bounds the queue refuses a new token
// at once, with authz.ErrOverloaded and a time to come back; a token of
// another flow still gets in.
func TestReviewQueueRefuses(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Config
		queued    []string // nodes of the tokens queued first
		node      string   // of the token that is refused
		timeout   time.Duration
		otherNode string // of a token still admitted after the refusal ("" none)
	}{
		{name: "the flow is full", cfg: Config{MaxPendingPerFlow: 2}, queued: []string{"node-a", "node-a"},
			node: "node-a", otherNode: "node-b"},
		{name: "the queue is full", cfg: Config{MaxPending: 3}, queued: []string{"node-a", "node-b", "node-c"},
			node: "node-d"},
		{name: "the deadline comes before the review's turn", cfg: Config{}, queued: []string{"node-a", "node-b", "node-c"},
			node: "node-d", timeout: 2 * time.Second, otherNode: "node-e"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				is := newIssuer(t, "k1")
				keys, err := NewIssuerKeys(IssuerKeysConfig{Fetch: is.fetch})
				if err != nil {
					t.Fatal(err)
				}
				api := newBlockingAPI() // the first review holds the only worker
				cfg := tc.cfg
				cfg.Client, cfg.Keys, cfg.ReviewRate, cfg.ReviewBurst, cfg.ReviewWorkers = api, keys, 1, 1, 1
				r := newReviewer(t, cfg)
				out := make(chan result, 16)
				authenticateAsync(t.Context(), r, nodeToken(t, is, "node-z", 0), out) // in flight
				synctest.Wait()
				for i, node := range tc.queued {
					authenticateAsync(t.Context(), r, nodeToken(t, is, node, i+1), out)
				}
				synctest.Wait()
				ctx := t.Context()
				if tc.timeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.timeout)
					defer cancel()
				}
				start := time.Now()
				_, err = r.Authenticate(ctx, nodeToken(t, is, tc.node, 99))
				var oe *authz.OverloadError
				if !errors.As(err, &oe) || !errors.Is(err, authz.ErrOverloaded) {
					t.Fatalf("error = %v, want an OverloadError", err)
				}
				if time.Since(start) != 0 {
					t.Errorf("refused after %v, want at once", time.Since(start))
				}
				if oe.RetryAfter <= 0 {
					t.Errorf("RetryAfter = %v, want a positive time", oe.RetryAfter)
				}
				waiting := 1 + len(tc.queued)
				if tc.otherNode != "" {
					authenticateAsync(t.Context(), r, nodeToken(t, is, tc.otherNode, 100), out)
					synctest.Wait()
					waiting++
					if got := r.Pending(); got != waiting {
						t.Errorf("Pending() = %d, want %d: the other node's token should be queued", got, waiting)
					}
				}
				close(api.release)
				for range waiting {
					<-out
				}
			})
		})
	}
}

// TestCacheHitsNeverQueue: while reviews of new tokens wait, a token the
// cache holds is answered at once.
func TestCacheHitsNeverQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(always(webPod()))
		gate := gatedClient{api.AuthenticationV1().TokenReviews(), make(chan struct{})}
		r := newReviewer(t, Config{Client: gate, ReviewWorkers: 1})
		known := tokenExpiringAt(t, time.Now().Add(time.Hour))
		res := make(chan result, 1)
		authenticateAsync(t.Context(), r, known, res)
		synctest.Wait()
		gate.release <- struct{}{} // the one review of the known token
		wantWebPod(t, <-res)
		out := make(chan result, 8)
		for n := range 8 {
			authenticateAsync(t.Context(), r, tokenExpiringAt(t, time.Now().Add(time.Hour+time.Duration(n+1)*time.Second)), out)
		}
		synctest.Wait() // eight new tokens wait behind a held review
		start := time.Now()
		if _, err := r.Authenticate(t.Context(), known); err != nil {
			t.Fatal(err)
		}
		if time.Since(start) != 0 || r.Pending() != 8 {
			t.Errorf("the known token took %v with %d reviews pending; want at once, 8", time.Since(start), r.Pending())
		}
		close(gate.release)
		for range 8 {
			<-out
		}
	})
}
