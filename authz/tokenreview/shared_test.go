package tokenreview

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"

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

func TestLeaderDeadlineFollowerRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newBlockingAPI()
		r := newReviewer(t, Config{Client: api})
		token := tokenExpiringAt(t, time.Now().Add(time.Hour))
		leaderCtx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		leader, follower := make(chan result, 1), make(chan result, 1)
		authenticateAsync(leaderCtx, r, token, leader)
		synctest.Wait()
		authenticateAsync(t.Context(), r, token, follower)
		if res := <-leader; !errors.Is(res.err, authz.ErrUnavailable) {
			t.Fatalf("leader error = %v, want ErrUnavailable", res.err)
		}
		synctest.Wait() // the follower has retried and waits in a call of its own
		if n := api.calls.Load(); n != 2 {
			t.Fatalf("API calls = %d, want 2", n)
		}
		close(api.release)
		wantWebPod(t, <-follower)
	})
}

func TestDeadlineReachesAPICall(t *testing.T) {
	tests := []struct {
		name          string
		reqTimeout    time.Duration // 0: no deadline on the request
		reviewTimeout time.Duration
		want          time.Duration // API call's deadline, from the start
	}{
		{"request deadline", 3 * time.Second, 0, 3 * time.Second},
		{"review timeout without request deadline", 0, 0, DefaultReviewTimeout},
		{"review timeout before request deadline", time.Minute, 2 * time.Second, 2 * time.Second},
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
				if got := time.Since(start); got != tc.want {
					t.Errorf("Authenticate returned after %v, want %v", got, tc.want)
				}
				synctest.Wait()
				if diff := cmp.Diff([]time.Time{start.Add(tc.want)}, api.deadlines); diff != "" {
					t.Errorf("API call deadlines (-want +got):\n%s", diff)
				}
			})
		})
	}
}
