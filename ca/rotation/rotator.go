package rotation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
)

// Retry and re-check intervals of Run.
const (
	// MinRetryDelay is the first wait after a failed step; it doubles up
	// to MaxRetryDelay.
	MinRetryDelay = time.Second
	MaxRetryDelay = 5 * time.Minute
	// MaxWait bounds every wait, so that Run re-plans at least this
	// often: a timer measures elapsed time, the plan wall-clock time, and
	// the two drift apart when the host suspends or its clock is set.
	MaxWait = time.Hour
)

// Store holds the CA state; castate.SecretStore implements it.
type Store interface {
	// Update applies fn to the freshest state and writes the result; fn
	// may be called more than once.
	Update(ctx context.Context, fn func(castate.State) (castate.State, error)) error
	// Current returns the last state seen, possibly stale.
	Current() castate.State
}

// Observer receives the rotation's progress, for metrics. Implementations
// must be safe for concurrent use and fast.
type Observer interface {
	// Rotated is called after a step was written, with a Step value.
	Rotated(step string)
}

// Config configures a Rotator. Store and Generate are required.
type Config struct {
	Store Store
	// Generate returns a new self-signed root with a new key, valid from
	// now (or earlier) for Policy.CATTL, e.g. keystore.GenerateRoot; or,
	// if the Store holds intermediates (castate.KindIntermediates), a new
	// intermediate issued by the external root, e.g.
	// keystore.GenerateIntermediate.
	Generate func(ctx context.Context, now time.Time) (*ca.Material, error)
	// Policy's zero fields take the defaults; see Policy.
	Policy Policy
	// Issuer, if set, returns the root that issues the next intermediate
	// (see PlanUnder); it is read at every plan.
	Issuer   func() Issuer
	Clock    clock.WithTicker
	Logger   *slog.Logger
	Observer Observer
}

// Rotator drives rotation. Only the leader should run it; every replica
// follows the result through the Store.
type Rotator struct {
	store    Store
	generate func(context.Context, time.Time) (*ca.Material, error)
	policy   Policy
	issuer   func() Issuer
	clock    clock.WithTicker
	log      *slog.Logger
	obs      Observer
	notify   chan struct{}
	running  atomic.Bool
}

// New checks cfg and returns a Rotator.
func New(cfg Config) (*Rotator, error) {
	if cfg.Store == nil || cfg.Generate == nil {
		return nil, errors.New("rotation: missing Store or Generate")
	}
	p, err := cfg.Policy.WithDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.Issuer == nil {
		cfg.Issuer = func() Issuer { return Issuer{} }
	}
	return &Rotator{
		store: cfg.Store, generate: cfg.Generate, policy: p, issuer: cfg.Issuer, clock: cfg.Clock,
		log: cfg.Logger, obs: cfg.Observer, notify: make(chan struct{}, 1),
	}, nil
}

// Notify tells Run that the state changed; call it from the store's
// onChange. It never blocks.
func (r *Rotator) Notify() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// Run rotates until ctx ends, then returns nil: it plans from the current
// state, takes a due step through Store.Update (which plans again on the
// fresh state, so a step is never taken twice), and otherwise waits until
// the next step is due or Notify is called. A failed step is logged and
// retried with backoff. While the store has no state yet (the zero
// State), Run waits for Notify.
func (r *Rotator) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("rotation: Run is already running")
	}
	defer r.running.Store(false)
	state, failures := r.store.Current(), 0
	for {
		now := r.clock.Now()
		step, at := r.plan(state, now)
		wait := at.Sub(now)
		if step != StepNone && wait <= 0 {
			next, err := r.take(ctx, now)
			if err == nil {
				state, failures = next, 0
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			failures++
			wait = retryDelay(failures)
			r.log.ErrorContext(ctx, "rotation step failed, will retry", "step", step, "retryIn", wait, "error", err)
		}
		if !r.sleep(ctx, step != StepNone || failures > 0, wait) {
			return nil
		}
		state = r.store.Current()
	}
}

// Next is the step the plan gives for the store's current state and when
// it is due; on any replica, for metrics: a step long due and not taken
// is a rotation that is stuck (no leader, or its writes failing).
func (r *Rotator) Next() (Step, time.Time) {
	return r.plan(r.store.Current(), r.clock.Now())
}

func (r *Rotator) plan(s castate.State, now time.Time) (Step, time.Time) {
	return PlanUnder(s, now, r.policy, r.issuer())
}

// take applies the step due at now to the store's freshest state, if one
// is still due there, and returns the state written (or found).
func (r *Rotator) take(ctx context.Context, now time.Time) (castate.State, error) {
	var (
		took  Step
		after castate.State
	)
	err := r.store.Update(ctx, func(fresh castate.State) (castate.State, error) {
		took, after = StepNone, fresh
		step, at := r.plan(fresh, now)
		if step == StepNone || at.After(now) {
			return fresh, nil // taken already, by us or another leader
		}
		var m *ca.Material
		if step == StepPrepare {
			var err error
			if m, err = r.newAuthority(ctx, fresh.Kind, now); err != nil {
				return fresh, err
			}
		}
		next, ok := apply(fresh, step, now, m)
		if !ok { // a bug: retrying at once would spin
			return fresh, fmt.Errorf("rotation: planned step %s does not apply", step)
		}
		took, after = step, next
		return after, nil
	})
	if err != nil {
		return castate.State{}, err
	}
	if took != StepNone {
		r.log.InfoContext(ctx, "CA rotation step taken", "step", took, "phase", after.Phase(),
			"activeSerial", fmt.Sprintf("%x", after.Active().Cert.SerialNumber))
		r.obs.Rotated(string(took))
	}
	return after, nil
}

// newAuthority generates the next root or intermediate (as kind says) and
// checks that it can be activated after PropagationDelay (none for
// intermediates) and then sign a leaf of LeafMaxTTL. An intermediate cut
// short by its root's expiry fails here until the operator rolls the root.
func (r *Rotator) newAuthority(ctx context.Context, kind castate.Kind, now time.Time) (*ca.Material, error) {
	noun := "root"
	if kind != castate.KindRoots {
		noun = "intermediate"
	}
	m, err := r.generate(ctx, now)
	if err != nil {
		return nil, fmt.Errorf("rotation: generating the next %s: %w", noun, err)
	}
	if m == nil || m.Cert == nil || m.Signer == nil {
		return nil, errors.New("rotation: Generate returned incomplete material")
	}
	p := r.policy.ForKind(kind)
	// An upstream's chain may end before its intermediate does.
	end := ChainNotAfter(m.Cert, castate.UpstreamChain(kind, m))
	if need := now.Add(p.PropagationDelay + p.LeafMaxTTL); end.Before(need) {
		return nil, fmt.Errorf("rotation: generated %s (with its chain) expires at %v, before %v (PropagationDelay + LeafMaxTTL from now)",
			noun, end, need)
	}
	return m, nil
}

// sleep waits for Notify, ctx, or (if timed) d capped at MaxWait. It
// reports false when ctx ended.
func (r *Rotator) sleep(ctx context.Context, timed bool, d time.Duration) bool {
	var fire <-chan time.Time
	if timed {
		t := r.clock.NewTimer(min(max(d, 0), MaxWait))
		defer t.Stop()
		fire = t.C()
	}
	select {
	case <-ctx.Done():
		return false
	case <-r.notify:
	case <-fire:
	}
	return true
}

// retryDelay is MinRetryDelay doubled per earlier failure, capped.
func retryDelay(failures int) time.Duration {
	d := MinRetryDelay
	for i := 1; i < failures && d < MaxRetryDelay; i++ {
		d *= 2
	}
	return min(d, MaxRetryDelay)
}

type nopObserver struct{}

func (nopObserver) Rotated(string) {}
