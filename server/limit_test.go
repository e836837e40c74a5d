package server

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/workload-ca/workload-ca/authz"
)

func TestCPULimiterQueuesThenFailsFast(t *testing.T) {
	limiterTest(t, 1, time.Second, func(t *testing.T, l *cpuLimiter) {
		release := make(chan struct{})
		go func() { _ = l.do(context.Background(), "node/a", false, func() error { <-release; return nil }) }()
		synctest.Wait() // the slot is taken

		// A request queues and gets the slot once it frees within the wait.
		done := make(chan error, 1)
		go func() { done <- l.do(context.Background(), "node/a", false, func() error { return nil }) }()
		time.Sleep(500 * time.Millisecond)
		close(release)
		if err := <-done; err != nil {
			t.Fatalf("queued request: %v", err)
		}

		// With the slot held past the wait, a request fails as overloaded.
		hold := make(chan struct{})
		go func() { _ = l.do(context.Background(), "node/a", false, func() error { <-hold; return nil }) }()
		synctest.Wait()
		start := time.Now()
		ran := false
		err := l.do(context.Background(), "node/a", false, func() error { ran = true; return nil })
		if ran {
			t.Fatal("a step ran without a free goroutine")
		}
		if !errors.Is(err, authz.ErrOverloaded) || time.Since(start) != time.Second {
			t.Fatalf("do() = %v after %v, want overloaded after 1s", err, time.Since(start))
		}
		if o := classify(context.Background(), err); o.code != codes.Unavailable || o.reason != "overloaded" {
			t.Fatalf("classify(overloaded) = %+v", o)
		}

		// A cancelled caller stops waiting at once.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := l.do(ctx, "node/a", false, func() error { return nil }); !errors.Is(err, context.Canceled) {
			t.Fatalf("do(cancelled) = %v", err)
		}
		close(hold)

		// Its goroutine exits once idle, and the next request starts one.
		time.Sleep(cpuIdleExit)
		synctest.Wait()
		if w := l.running(); w != 0 {
			t.Fatalf("%d goroutines after %v idle, want 0", w, cpuIdleExit)
		}
		if err := l.do(context.Background(), "node/a", false, func() error { return nil }); err != nil {
			t.Fatalf("do() after idle exit: %v", err)
		}
	})
}

func TestCPULimiterRunsAtMostNAtOnce(t *testing.T) {
	const n = 3
	limiterTest(t, n, time.Minute, func(t *testing.T, l *cpuLimiter) {
		var running, most int
		var mu sync.Mutex
		release := make(chan struct{})
		step := func() error {
			mu.Lock()
			running++
			most = max(most, running)
			mu.Unlock()
			<-release
			mu.Lock()
			running--
			mu.Unlock()
			return nil
		}
		errs := make(chan error, 2*n)
		for range 2 * n {
			go func() { errs <- l.do(context.Background(), "node/a", false, step) }()
		}
		synctest.Wait()
		if running != n || l.running() != n {
			t.Fatalf("%d steps on %d goroutines, want %d on %d", running, l.running(), n, n)
		}
		close(release)
		for range 2 * n {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if most != n {
			t.Fatalf("at most %d steps at once, want %d", most, n)
		}
	})
}

func TestCPULimiterReturnsErrorsAndRaisesPanicsInTheCaller(t *testing.T) {
	limiterTest(t, 1, time.Second, func(t *testing.T, l *cpuLimiter) {
		boom := errors.New("bad CSR")
		if err := l.do(context.Background(), "node/a", false, func() error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("do() = %v, want %v", err, boom)
		}
		func() {
			defer func() {
				p, ok := recover().(*stepPanic)
				if !ok || p.value != "signer bug" || !strings.Contains(p.Error(), "server.TestCPULimiter") {
					t.Fatalf("recovered %v, want the step's panic with the step's stack", p)
				}
			}()
			_ = l.do(context.Background(), "node/a", false, func() error { panic("signer bug") })
			t.Fatal("do() returned after a panic")
		}()
		// The goroutine survived the panic and still serves.
		if err := l.do(context.Background(), "node/a", false, func() error { return nil }); err != nil || l.running() != 1 {
			t.Fatalf("do() after a panic = %v on %d goroutines", err, l.running())
		}
	})
}

func TestCPULimiterStepThatExitsItsGoroutineExitsTheCallers(t *testing.T) {
	limiterTest(t, 1, time.Second, func(t *testing.T, l *cpuLimiter) {
		returned := make(chan bool, 1)
		go func() {
			defer func() { returned <- false }()
			_ = l.do(context.Background(), "node/a", false, func() error { runtime.Goexit(); return nil })
			returned <- true
		}()
		if <-returned {
			t.Fatal("do() returned after the step called runtime.Goexit")
		}
		if err := l.do(context.Background(), "node/a", false, func() error { return nil }); err != nil || l.running() != 1 {
			t.Fatalf("do() after a Goexit = %v on %d goroutines, want nil on 1", err, l.running())
		}
	})
}

// A caller that finds the only goroutine just as it gives up waiting for
// work is served by it or by a new one, never left waiting.
func TestCPULimiterCallerAtIdleExitIsServed(t *testing.T) {
	limiterTest(t, 1, time.Minute, func(t *testing.T, l *cpuLimiter) {
		for i := range 200 {
			if err := l.do(context.Background(), "node/a", false, func() error { return nil }); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			time.Sleep(cpuIdleExit) // the goroutine's idle timer fires now
			start := time.Now()
			if err := l.do(context.Background(), "node/a", false, func() error { return nil }); err != nil || time.Since(start) != 0 {
				t.Fatalf("round %d: do() at the idle exit = %v after %v", i, err, time.Since(start))
			}
		}
	})
}

// limiterTest runs test in a synctest bubble with a new limiter, then
// waits until the limiter's goroutines have exited, as the bubble requires.
func limiterTest(t *testing.T, n int, wait time.Duration, test func(*testing.T, *cpuLimiter)) {
	synctest.Test(t, func(t *testing.T) {
		l := newCPULimiter(limiterConfig{n: n, wait: wait, maxQueued: 1 << 20, maxPerFlow: 1 << 20})
		test(t, l)
		time.Sleep(cpuIdleExit)
	})
}

// running returns how many goroutines the limiter runs.
func (l *cpuLimiter) running() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.workers
}

// TestCPULimiterRefusesBeyondItsBounds: with the only slot held, callers
// beyond a bound are refused at once, told when to come back, while
// others still queue.
func TestCPULimiterRefusesBeyondItsBounds(t *testing.T) {
	tests := []struct {
		name       string
		cfg        limiterConfig
		queued     []string // flows of the callers queued first
		flow       string   // of the caller refused
		deadline   time.Duration
		admittedAs string // a flow still admitted after the refusal ("" none)
	}{
		{name: "the queue is full", cfg: limiterConfig{maxQueued: 3, maxPerFlow: 10},
			queued: []string{"node/a", "node/b", "node/c"}, flow: "node/d"},
		{name: "the node's share is full", cfg: limiterConfig{maxQueued: 10, maxPerFlow: 2},
			queued: []string{"node/a", "node/a"}, flow: "node/a", admittedAs: "node/b"},
		{name: "the deadline comes before the turn", cfg: limiterConfig{maxQueued: 10, maxPerFlow: 10},
			queued: []string{"node/a", "node/b"}, flow: "node/c", deadline: time.Microsecond, admittedAs: "node/d"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := tc.cfg
				cfg.n, cfg.wait = 1, time.Minute
				l := newCPULimiter(cfg)
				release := make(chan struct{})
				hold := func() error { <-release; return nil }
				errs := make(chan error, 16)
				go func() { errs <- l.do(context.Background(), "node/z", false, hold) }()
				synctest.Wait()
				for _, f := range tc.queued {
					go func() { errs <- l.do(context.Background(), f, false, hold) }()
				}
				synctest.Wait()
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				start := time.Now()
				ran := false
				err := l.do(ctx, tc.flow, false, func() error { ran = true; return nil })
				var oe *authz.OverloadError
				if !errors.As(err, &oe) || ran || time.Since(start) != 0 {
					t.Fatalf("do() = %v after %v (ran %v), want an OverloadError at once", err, time.Since(start), ran)
				}
				if oe.RetryAfter <= 0 {
					t.Errorf("RetryAfter = %v, want positive", oe.RetryAfter)
				}
				waiting := 1 + len(tc.queued)
				if tc.admittedAs != "" {
					go func() { errs <- l.do(context.Background(), tc.admittedAs, false, hold) }()
					synctest.Wait()
					waiting++
					if got := int(l.waiting.Load()); got != waiting-1 {
						t.Errorf("%d callers wait, want %d: %s should be queued", got, waiting-1, tc.admittedAs)
					}
				}
				close(release)
				for range waiting {
					if err := <-errs; err != nil {
						t.Error(err)
					}
				}
				time.Sleep(cpuIdleExit)
			})
		})
	}
}

// TestCPULimiterFinishesStartedWorkFirst: a request's second step goes
// before the first steps queued ahead of it.
func TestCPULimiterFinishesStartedWorkFirst(t *testing.T) {
	limiterTest(t, 1, time.Minute, func(t *testing.T, l *cpuLimiter) {
		release := make(chan struct{})
		go func() { _ = l.do(context.Background(), "node/z", false, func() error { <-release; return nil }) }()
		synctest.Wait()
		var mu sync.Mutex
		var order []string
		step := func(name string) func() error {
			return func() error { mu.Lock(); order = append(order, name); mu.Unlock(); return nil }
		}
		done := make(chan error, 3)
		go func() { done <- l.do(context.Background(), "node/a", false, step("first step of a")) }()
		synctest.Wait()
		go func() { done <- l.do(context.Background(), "node/b", false, step("first step of b")) }()
		synctest.Wait()
		go func() { done <- l.do(context.Background(), "node/c", true, step("second step of c")) }()
		synctest.Wait()
		close(release)
		for range 3 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		want := []string{"second step of c", "first step of a", "first step of b"}
		if !slices.Equal(order, want) {
			t.Errorf("order %q, want %q", order, want)
		}
	})
}
