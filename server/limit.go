package server

import (
	"context"
	"errors"
	"time"
)

// errOverloaded is returned when CPU-bound work waited its whole queue
// time for a slot.
var errOverloaded = errors.New("overloaded")

// cpuLimiter bounds the CPU-bound steps of a request (CSR checks, signing)
// to about the number of cores. Excess requests queue briefly, then fail
// fast with Unavailable (clients retry with backoff) instead of piling up
// goroutines and memory behind a saturated CPU.
type cpuLimiter struct {
	slots chan struct{}
	wait  time.Duration
}

func newCPULimiter(n int, wait time.Duration) *cpuLimiter {
	return &cpuLimiter{slots: make(chan struct{}, n), wait: wait}
}

// do runs f in a slot.
func (l *cpuLimiter) do(ctx context.Context, f func() error) error {
	select {
	case l.slots <- struct{}{}:
	default:
		if err := l.queue(ctx); err != nil {
			return err
		}
	}
	defer func() { <-l.slots }()
	return f()
}

// queue waits for a slot for at most l.wait.
func (l *cpuLimiter) queue(ctx context.Context) error {
	t := time.NewTimer(l.wait)
	defer t.Stop()
	select {
	case l.slots <- struct{}{}:
		return nil
	case <-t.C:
		return errOverloaded
	case <-ctx.Done():
		return ctx.Err()
	}
}
