package keyloop

import (
	"context"
	"errors"
	"fmt"
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

// gate records the order and overlap of reconciles; the keys "slow" and
// "slow2" block until release is closed.
type gate struct {
	release chan struct{}
	mu      sync.Mutex
	order   []string
	running map[string]int
	overlap []string // keys that ran twice at once
	peak    int      // most reconciles running at once
}

func (g *gate) reconcile(ctx context.Context, key string) error {
	g.mu.Lock()
	g.running[key]++
	if g.running[key] > 1 {
		g.overlap = append(g.overlap, key)
	}
	total := 0
	for _, n := range g.running {
		total += n
	}
	g.peak = max(g.peak, total)
	g.mu.Unlock()
	if key == "slow" || key == "slow2" {
		select {
		case <-g.release:
		case <-ctx.Done():
		}
	}
	g.mu.Lock()
	g.running[key]--
	g.order = append(g.order, key)
	g.mu.Unlock()
	return nil
}

func (g *gate) done(keys ...string) func() bool {
	return func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		seen := map[string]int{}
		for _, k := range g.order {
			seen[k]++
		}
		for _, k := range keys {
			if seen[k] == 0 {
				return false
			}
			seen[k]--
		}
		return true
	}
}

func TestWorkers(t *testing.T) {
	tests := []struct {
		name    string
		workers int
		// whether the other keys finish while the slow ones block
		othersPass bool
	}{
		{name: "default: one key at a time, in queue order", workers: 0},
		{name: "one worker", workers: 1},
		{name: "three workers: two slow keys hold up two of them only", workers: 3, othersPass: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &gate{release: make(chan struct{}), running: map[string]int{}}
			q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
			l := &Loop{Queue: q, Keys: func() []string { return []string{"slow", "slow2", "a", "b", "c"} },
				Reconcile: g.reconcile, Clock: clocktesting.NewFakeClock(time.Now()), Resync: time.Hour, Workers: tt.workers}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { l.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()

			slow := []string{"slow"} // running at once
			if tt.othersPass {
				slow = append(slow, "slow2")
			}
			testwait.Eventually(t, fmt.Sprint(slow, " running"), func() bool {
				g.mu.Lock()
				defer g.mu.Unlock()
				for _, k := range slow {
					if g.running[k] != 1 {
						return false
					}
				}
				return true
			})
			q.Add("slow") // again while in flight: must wait for the first
			q.Add("late") // queued while the slow keys run
			if tt.othersPass {
				testwait.Eventually(t, "the other keys while slow and slow2 block", g.done("a", "b", "c", "late"))
			}
			close(g.release)
			testwait.Eventually(t, "every key, slow twice", g.done("slow", "slow", "slow2", "a", "b", "c", "late"))

			g.mu.Lock()
			defer g.mu.Unlock()
			if len(g.overlap) > 0 {
				t.Errorf("keys reconciled twice at once: %v", g.overlap)
			}
			// One worker: nothing ran beside slow. Three: late ran beside
			// both slow ones, and never a fourth reconcile.
			if want := max(tt.workers, 1); g.peak != want {
				t.Errorf("at most %d reconciles at once, want %d", g.peak, want)
			}
			if !tt.othersPass && g.order[0] != "slow" {
				t.Errorf("order %v: want slow first", g.order)
			}
		})
	}
}
