// Package testwait waits in tests for something another goroutine or
// process brings about.
package testwait

import (
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
