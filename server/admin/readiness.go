package admin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// Check is one readiness condition.
type Check struct {
	Name  string
	Check func(ctx context.Context) error
}

// Readiness is the conjunction of checks, shared by /readyz and the gRPC
// health service so both always agree.
type Readiness struct {
	checks []Check
}

// NewReadiness returns the conjunction of checks.
func NewReadiness(checks ...Check) *Readiness { return &Readiness{checks: checks} }

// Err returns nil when every check passes, else the failures joined.
func (r *Readiness) Err(ctx context.Context) error {
	var errs []error
	for _, c := range r.checks {
		if err := c.Check(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Cached runs check at most once per ttl and returns its last result in
// between, so an expensive check (a real signature, perhaps by an HSM) can
// back readiness that every request consults. Reads of a fresh result take
// no lock; one caller refreshes a stale one while others wait for it.
func Cached(check func(context.Context) error, ttl time.Duration, clk clock.PassiveClock) func(context.Context) error {
	if clk == nil {
		clk = clock.RealClock{}
	}
	type result struct {
		err error
		at  time.Time
	}
	var (
		last atomic.Pointer[result]
		mu   sync.Mutex
	)
	return func(ctx context.Context) error {
		if r := last.Load(); r != nil && clk.Since(r.at) < ttl {
			return r.err
		}
		mu.Lock()
		defer mu.Unlock()
		if r := last.Load(); r != nil && clk.Since(r.at) < ttl {
			return r.err // refreshed while we waited
		}
		r := &result{err: check(ctx), at: clk.Now()}
		if r.err != nil && ctx.Err() != nil {
			// Failed because this caller went away: not a result for
			// the callers of the next ttl.
			return r.err
		}
		last.Store(r)
		return r.err
	}
}
