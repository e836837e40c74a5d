package admin

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
// back a readiness endpoint polled often.
func Cached(check func(context.Context) error, ttl time.Duration, clk clock.PassiveClock) func(context.Context) error {
	if clk == nil {
		clk = clock.RealClock{}
	}
	var (
		mu   sync.Mutex
		at   time.Time
		last error
		done bool
	)
	return func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if done && clk.Since(at) < ttl {
			return last
		}
		last, at, done = check(ctx), clk.Now(), true
		return last
	}
}
