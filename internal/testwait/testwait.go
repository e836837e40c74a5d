// Package testwait waits in tests for something another goroutine or
// process brings about.
package testwait

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Timeout bounds every Eventually.
const Timeout = 10 * time.Second

// Eventually polls cond until it holds, and fails t (naming what it waited
// for) if it does not within Timeout.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", Timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Run runs run in the background until stop is called or the test ends,
// whichever is first; then it cancels run's context, waits for run to
// return, and fails t unless it returned nil.
func Run(t testing.TB, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
