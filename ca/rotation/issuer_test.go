package rotation_test

import (
	"context"
	"crypto/x509"
	"testing"
	"testing/synctest"
	"time"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/internal/testlog"
)

// TestPlanUnderNewIssuer plans intermediates of an old plug-in root while
// the operator has made a new root the signing one: the CA moves to it
// before the scheduled rotation, but only once every verifier trusts it.
// The active intermediate A of the old root lives from t0 to t0+730d.
func TestPlanUnderNewIssuer(t *testing.T) {
	p := rotation.DefaultPolicy()
	p.LeafMaxTTL = 90 * day // the arithmetic below is in 90-day leaves
	d := func(days float64) time.Time { return t0.Add(time.Duration(days * float64(day))) }
	oldRoot, newRoot := pluginRoot(t, d(-1), d(3650)), pluginRoot(t, d(-1), d(3650))
	a := inter(t, oldRoot, t0, d(730), active, t0)
	// The new root entered the bundle on day 100 and is trusted a
	// PropagationDelay later.
	trusted := d(100).Add(p.PropagationDelay)
	moved := rotation.Issuer{Cert: newRoot.Cert, TrustedFrom: trusted}
	tests := []struct {
		name  string
		state castate.State
		iss   rotation.Issuer
		now   time.Time
		step  rotation.Step
		at    time.Time
	}{
		{"same issuer: the schedule", interState(a), rotation.Issuer{Cert: oldRoot.Cert, TrustedFrom: t0}, d(100),
			rotation.StepPrepare, d(365)},
		{"no issuer: the schedule", interState(a), rotation.Issuer{}, d(100), rotation.StepPrepare, d(365)},
		{"new issuer: prepare at once", interState(a), moved, d(100), rotation.StepPrepare, d(100)},
		{"prepared by the new issuer: activate once it is trusted",
			interState(a, inter(t, newRoot, d(100), d(830), prepared, d(100))), moved, d(100), rotation.StepActivate, trusted},
		{"prepared by the new issuer, trusted long ago: activate at once",
			interState(a, inter(t, newRoot, d(200), d(930), prepared, d(200))), moved, d(200), rotation.StepActivate, d(200)},
		{"prepared by the new issuer, not yet valid: activate at its notBefore",
			interState(a, inter(t, newRoot, d(201), d(930), prepared, d(200))), moved, d(200), rotation.StepActivate, d(201)},
		{"prepared by the old issuer: retire it at once",
			interState(a, inter(t, oldRoot, d(365), d(1095), prepared, d(365))), moved, d(400), rotation.StepRetireStart, d(400)},
		{"prepared by the old issuer, the active one by the new: retire it at once",
			interState(inter(t, newRoot, d(110), d(840), active, d(110)), inter(t, oldRoot, d(365), d(1095), prepared, d(365))),
			moved, d(400), rotation.StepRetireStart, d(400)},
		{"active expired: activate as soon as valid, trusted or not",
			interState(a, inter(t, newRoot, d(729), d(1460), prepared, d(729))),
			rotation.Issuer{Cert: newRoot.Cert, TrustedFrom: d(740)}, d(730.5), rotation.StepActivate, d(730.5)},
		{"a removal due before the move comes first",
			interState(inter(t, oldRoot, d(-365), d(365), retiring, d(10)), a, inter(t, newRoot, d(100), d(830), prepared, d(100))),
			rotation.Issuer{Cert: newRoot.Cert, TrustedFrom: d(200)}, d(100), rotation.StepRemove, d(10 + 90).Add(time.Hour)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			step, at := rotation.PlanUnder(tt.state, tt.now, p, tt.iss)
			if step != tt.step || !near(at, tt.at) {
				t.Errorf("PlanUnder = %s at %v (day %.3f), want %s at %v", step, at, at.Sub(t0).Hours()/24, tt.step, tt.at)
			}
		})
	}
	// A state of self-signed roots has no issuer to follow.
	roots := state(root(t, t0, d(730), active, t0))
	if step, at := rotation.PlanUnder(roots, d(100), p, moved); step != rotation.StepPrepare || !near(at, d(365)) {
		t.Errorf("roots: PlanUnder = %s at day %.3f, want the schedule (prepare at day 365)", step, at.Sub(t0).Hours()/24)
	}
}

// TestRotatorFollowsNewIssuer runs a Rotator whose plug-in root is
// replaced mid-life: it prepares an intermediate of the new root when
// woken, activates it when the new root is trusted and not a second
// before, and from then on rotates on the new intermediate's schedule.
func TestRotatorFollowsNewIssuer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, oldRoot := interHarness(t)
		newRoot := pluginRoot(t, t0.Add(-day), t0.Add(3650*day))
		iss := rotation.Issuer{Cert: oldRoot.Cert, TrustedFrom: t0}
		var gen func(context.Context, time.Time) (*ca.Material, error)
		h.gen = func(ctx context.Context, now time.Time) (*ca.Material, error) { return gen(ctx, now) }
		gen = intermediateGenerator(oldRoot, h.policy.CATTL)
		obs := &recorder{}
		r, err := rotation.New(rotation.Config{Store: h.store, Generate: h.gen, Policy: h.policy, Clock: h.clk,
			Logger: testlog.New(t), Observer: obs, Issuer: func() rotation.Issuer { return iss }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() { _ = r.Run(ctx) }()
		synctest.Wait()
		first := h.store.state().Active()

		h.advanceTo(t0.Add(100 * day))
		if h.store.writeCount() != 0 {
			t.Fatal("a step before the root changed")
		}
		// The operator's new root: the CA reloads it and wakes the rotator.
		iss = rotation.Issuer{Cert: newRoot.Cert, TrustedFrom: h.clk.Now().Add(h.policy.PropagationDelay)}
		gen = intermediateGenerator(newRoot, h.policy.CATTL)
		r.Notify()
		synctest.Wait()
		if obs.steps() != "prepare" {
			t.Fatalf("after the root changed: steps %q, want prepare at once", obs.steps())
		}
		h.advanceTo(iss.TrustedFrom.Add(-time.Second))
		if obs.steps() != "prepare" {
			t.Fatalf("steps %q before the new root is trusted, want none but prepare", obs.steps())
		}
		h.advanceTo(iss.TrustedFrom)
		if obs.steps() != "prepare,activate" {
			t.Fatalf("steps %q once the new root is trusted, want activate", obs.steps())
		}
		s := h.store.state()
		if err := s.ValidateUnder([]*x509.Certificate{oldRoot.Cert, newRoot.Cert}); err != nil {
			t.Fatalf("after the move: %v", err)
		}
		if !castate.IssuedBy(newRoot.Cert, s.Active().Cert) {
			t.Fatal("after the move: the active intermediate is not the new root's")
		}
		if s.Authorities[0].Status != retiring || !s.Authorities[0].Cert.Equal(first.Cert) {
			t.Fatal("the old root's intermediate is not retiring")
		}
		// From here on the ordinary schedule, on the new intermediate.
		step, at := h.due()
		if step != rotation.StepRemove || !near(at, iss.TrustedFrom.Add(h.policy.LeafMaxTTL+h.policy.SkewMargin)) {
			t.Fatalf("next: %s at %v, want the old intermediate removed after its last leaf", step, at)
		}
	})
}
