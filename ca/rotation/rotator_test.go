package rotation_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/workload-ca/workload-ca/internal/testlog"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/ca/rotation"
)

// harness runs Rotators on a fake clock inside a synctest bubble: after
// every clock change, synctest.Wait returns once they all wait again.
type harness struct {
	t      *testing.T
	clk    *testingclock.FakeClock
	store  *memStore
	policy rotation.Policy
	gen    func(context.Context, time.Time) (*ca.Material, error)
}

func newHarness(t *testing.T) *harness {
	p := rotation.DefaultPolicy()
	h := &harness{t: t, clk: testingclock.NewFakeClock(t0), policy: p, gen: generator(p.CATTL)}
	first, err := h.gen(context.Background(), t0)
	if err != nil {
		t.Fatal(err)
	}
	h.store = newMemStore(t, state(castate.Authority{Cert: first.Cert, Key: first.Signer, Status: active, PreparedAt: t0, ActivatedAt: t0}))
	return h
}

// start runs a new Rotator until the test ends or stop is called.
func (h *harness) start() (obs *recorder, stop func()) {
	obs = &recorder{}
	r, err := rotation.New(rotation.Config{
		Store: h.store, Generate: h.gen, Policy: h.policy, Clock: h.clk, Logger: testlog.New(h.t), Observer: obs,
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.store.mu.Lock()
	h.store.onChange = append(h.store.onChange, r.Notify)
	h.store.mu.Unlock()
	ctx, cancel := context.WithCancel(h.t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	synctest.Wait()
	stop = func() {
		cancel()
		if err := <-done; err != nil {
			h.t.Errorf("Run: %v", err)
		}
	}
	h.t.Cleanup(func() { cancel() })
	return obs, stop
}

// advanceTo sets the clock and waits for the rotators to settle.
func (h *harness) advanceTo(at time.Time) {
	h.clk.SetTime(at)
	synctest.Wait()
}

// due returns the next step of the stored state and when it is due.
func (h *harness) due() (rotation.Step, time.Time) {
	return rotation.Plan(h.store.state(), h.clk.Now(), h.policy)
}

// expectStep advances to just before the next step (nothing may happen),
// then to its time (it must be taken), and returns the time.
func (h *harness) expectStep(want rotation.Step) time.Time {
	h.t.Helper()
	step, at := h.due()
	if step != want {
		h.t.Fatalf("next step is %s, want %s", step, want)
	}
	writes := h.store.writeCount()
	h.advanceTo(at.Add(-time.Second))
	if h.store.writeCount() != writes {
		h.t.Fatalf("%s taken before its time %v", want, at)
	}
	h.advanceTo(at)
	if h.store.writeCount() != writes+1 {
		h.t.Fatalf("%s not taken at its time %v", want, at)
	}
	return at
}

func TestRotatorFullRotation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		first := h.store.state().Active()
		obs, stop := h.start()
		defer stop()
		h.expectStep(rotation.StepPrepare)
		if s := h.store.state(); s.Phase() != castate.PhasePrepared || !s.Active().Cert.Equal(first.Cert) {
			t.Fatal("after prepare: want the first root still signing, a prepared one in the bundle")
		}
		activated := h.expectStep(rotation.StepActivate)
		s := h.store.state()
		if s.Phase() != castate.PhaseRetiring || s.Authorities[0].Status != retiring || s.Active().Cert.Equal(first.Cert) {
			t.Fatal("after activate: want the new root signing and the first retiring")
		}
		removed := h.expectStep(rotation.StepRemove)
		if got, want := removed.Sub(activated), h.policy.LeafMaxTTL+h.policy.SkewMargin; got != want {
			t.Errorf("old root removed %v after activation, want %v", got, want)
		}
		if s := h.store.state(); len(s.Authorities) != 1 || s.Authorities[0].Cert.Equal(first.Cert) {
			t.Fatal("after remove: want the new root alone")
		}
		if got := obs.steps(); got != "prepare,activate,remove" {
			t.Errorf("Observer.Rotated got %s", got)
		}
		h.expectStep(rotation.StepPrepare) // and so on, with the new root
	})
}

func TestRotatorResumesAfterRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		_, stop := h.start()
		h.expectStep(rotation.StepPrepare)
		stop()
		prep := h.store.state().Authorities[1]
		_, at := h.due()
		h.advanceTo(at.Add(-day)) // the leader is away for months
		obs, stop := h.start()
		defer stop()
		if s := h.store.state(); len(s.Authorities) != 2 || !s.Authorities[1].Cert.Equal(prep.Cert) {
			t.Fatal("the new leader prepared again instead of resuming")
		}
		h.expectStep(rotation.StepActivate)
		if !h.store.state().Active().Cert.Equal(prep.Cert) {
			t.Error("the new leader did not activate the root the old one prepared")
		}
		if got := obs.steps(); got != "activate" {
			t.Errorf("new leader took %s, want activate", got)
		}
	})
}

// TestRotatorTwoLeaders: two Rotators on one store (a leader handover that
// overlaps), one of them following a store that never catches up, take
// every step once.
func TestRotatorTwoLeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		initial := h.store.state()
		h.store.stale = &initial
		a, stopA := h.start()
		defer stopA()
		b, stopB := h.start()
		defer stopB()
		h.expectStep(rotation.StepPrepare)
		h.expectStep(rotation.StepActivate)
		h.expectStep(rotation.StepRemove)
		if n := len(a.taken()) + len(b.taken()); n != 3 {
			t.Errorf("steps taken: %s and %s, want 3 in all", a.steps(), b.steps())
		}
	})
}

func TestRotatorRetriesFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		obs, stop := h.start()
		defer stop()
		_, at := h.due()
		h.store.mu.Lock()
		h.store.failures = 2
		h.store.mu.Unlock()
		h.advanceTo(at)
		h.advanceTo(at.Add(rotation.MinRetryDelay))
		if h.store.writeCount() != 0 {
			t.Fatal("wrote through a failing store")
		}
		h.advanceTo(at.Add(3 * rotation.MinRetryDelay)) // second retry waits twice as long
		if h.store.writeCount() != 1 || obs.steps() != "prepare" {
			t.Fatalf("after two failures: %d writes, steps %q; want the prepare taken", h.store.writeCount(), obs.steps())
		}
	})
}

// TestRotatorNextShowsAStuckStep: Next, on a replica that does not rotate,
// reports the step due and when; with nobody taking it, the time stays in
// the past (what the stuck-rotation alert reads); once the leader takes
// it, Next moves to the following step.
func TestRotatorNextShowsAStuckStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		follower, err := rotation.New(rotation.Config{Store: h.store, Generate: h.gen, Policy: h.policy, Clock: h.clk})
		if err != nil {
			t.Fatal(err)
		}
		step, at := follower.Next()
		if want, wantAt := h.due(); step != rotation.StepPrepare || step != want || !at.Equal(wantAt) || !at.After(h.clk.Now()) {
			t.Fatalf("Next = %s at %v; want prepare at %v, in the future", step, at, wantAt)
		}
		h.advanceTo(at.Add(time.Hour)) // nobody rotates
		if s, stuck := follower.Next(); s != rotation.StepPrepare || !stuck.Equal(at) {
			t.Fatalf("an hour past due with no leader: Next = %s at %v; want prepare still at %v", s, stuck, at)
		}
		_, stop := h.start()
		defer stop()
		if s, next := follower.Next(); s != rotation.StepActivate || !next.After(h.clk.Now()) {
			t.Fatalf("after the leader prepared: Next = %s at %v; want activate, in the future", s, next)
		}
	})
}

func TestRotatorRefusesShortLivedRoot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.gen = generator(h.policy.LeafMaxTTL) // cannot outlive a leaf after propagation
		_, stop := h.start()
		defer stop()
		_, at := h.due()
		h.advanceTo(at)
		h.advanceTo(at.Add(rotation.MinRetryDelay))
		if h.store.writeCount() != 0 {
			t.Fatal("prepared a root too short-lived for the policy")
		}
	})
}

// TestRotatorFollowsOthers: another leader prepares; Notify makes this
// one plan again, and it activates at the right time.
func TestRotatorFollowsOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		obs, stop := h.start()
		defer stop()
		_, at := h.due()
		h.advanceTo(at.Add(-time.Hour)) // just before our own prepare
		m, err := h.gen(context.Background(), h.clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		now := h.clk.Now()
		err = h.store.Update(t.Context(), func(s castate.State) (castate.State, error) {
			return rotation.Apply(s, rotation.StepPrepare, now, m), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		h.expectStep(rotation.StepActivate)
		if got := obs.steps(); got != "activate" {
			t.Errorf("steps taken: %s, want activate only", got)
		}
		if !h.store.state().Active().Cert.Equal(m.Cert) {
			t.Error("did not activate the other leader's root")
		}
	})
}

func TestNewRequires(t *testing.T) {
	gen := generator(rotation.DefaultCATTL)
	for name, cfg := range map[string]rotation.Config{
		"no store":       {Generate: gen},
		"no generate":    {Store: &memStore{}},
		"invalid policy": {Store: &memStore{}, Generate: gen, Policy: rotation.Policy{CATTL: day}},
	} {
		if _, err := rotation.New(cfg); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}
