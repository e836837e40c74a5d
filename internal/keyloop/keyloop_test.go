package keyloop

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/internal/testwait"
)

// recorder counts reconciles per key and fails a key a set number of
// times first.
type recorder struct {
	mu    sync.Mutex
	calls map[string]int
	fail  map[string]int
}

func (r *recorder) reconcile(_ context.Context, key string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[key]++
	if r.fail[key] > 0 {
		r.fail[key]--
		return errors.New("not yet")
	}
	return nil
}

func (r *recorder) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[key]
}

func newLoop(rec *recorder, clk *clocktesting.FakeClock) *Loop {
	// Retries on the real clock, a millisecond apart; resyncs on clk.
	q := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Millisecond, time.Millisecond))
	return &Loop{Queue: q, Keys: func() []string { return []string{"a", "b"} },
		Reconcile: rec.reconcile, Clock: clk, Resync: time.Minute}
}

func TestRun(t *testing.T) {
	rec := &recorder{calls: map[string]int{}, fail: map[string]int{"b": 2}}
	clk := clocktesting.NewFakeClock(time.Now())
	l := newLoop(rec, clk)
	var cur Current
	cur.EnqueueAll() // no loop yet: nothing to do
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { cur.Run(ctx, l); close(done) }()

	t.Run("every key at start, failures retried until they succeed", func(t *testing.T) {
		testwait.Eventually(t, "a once, b after two retries", func() bool { return rec.count("a") == 1 && rec.count("b") == 3 })
	})
	t.Run("every key again on resync", func(t *testing.T) {
		testwait.Eventually(t, "the resync ticker", clk.HasWaiters)
		clk.Step(time.Minute)
		testwait.Eventually(t, "every key again", func() bool { return rec.count("a") == 2 && rec.count("b") == 4 })
	})
	t.Run("keys added to the queue", func(t *testing.T) {
		l.Queue.Add("c")
		testwait.Eventually(t, "the added key", func() bool { return rec.count("c") == 1 })
	})
	t.Run("every key again when asked through Current", func(t *testing.T) {
		cur.EnqueueAll()
		testwait.Eventually(t, "every key a third time", func() bool { return rec.count("a") == 3 && rec.count("b") == 5 })
	})
	t.Run("returns when ctx ends, queue shut down", func(t *testing.T) {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return")
		}
		if !l.Queue.ShuttingDown() {
			t.Error("queue not shut down")
		}
	})
}
