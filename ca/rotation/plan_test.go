package rotation_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/ca/rotation"
)

const (
	prepared = castate.StatusPrepared
	active   = castate.StatusActive
	retiring = castate.StatusRetiring
)

// TestPlan runs the default policy with 90-day leaves (CA 730 days,
// prepare at 1/2, activate at 5/6, propagation 24h, margin 1h: leaves as
// long as a root's last sixth leave it no room) over the life cycle and
// its edge cases. The active root A lives from t0 to t0+730d.
func TestPlan(t *testing.T) {
	p := rotation.DefaultPolicy()
	p.LeafMaxTTL = 90 * day
	d := func(days float64) time.Time { return t0.Add(time.Duration(days * float64(day))) }
	a := root(t, t0, d(730), active, t0)
	// next is a root prepared at day n, valid from an hour before for 730 days.
	next := func(n float64) castate.Authority { return root(t, d(n).Add(-time.Hour), d(n+730), prepared, d(n)) }
	tests := []planCase{
		{"steady: prepare at 1/2", state(a), t0, rotation.StepPrepare, d(365)},
		{"steady past 1/2: prepare is due", state(a), d(400), rotation.StepPrepare, d(365)},
		{"active expired, nothing prepared: prepare", state(a), d(731), rotation.StepPrepare, d(365)},
		{"prepared on time: activate at 5/6", state(a, next(365)), d(365), rotation.StepActivate, d(730 * 5.0 / 6)},
		{"prepared late: propagation delay wins", state(a, next(620)), d(620), rotation.StepActivate, d(621)},
		{"prepared after A's signing deadline: still waits for propagation", state(a, next(700)), d(700), rotation.StepActivate, d(701)},
		{"active expired: activate at once", state(a, next(729.9)), d(730.1), rotation.StepActivate, d(730.1)},
		{"prepared root outlives no leaf: abandon it", state(a, root(t, d(365), d(365+60), prepared, d(365))), d(366), rotation.StepRetireStart, d(366)},
		{"short-lived prepared root: activate early, while it outlives a leaf", state(a, root(t, d(365), d(500), prepared, d(365))), d(400), rotation.StepActivate, d(410)},
		{"short-lived prepared root, window missed: abandon it", state(a, root(t, d(365), d(500), prepared, d(365))), d(411), rotation.StepRetireStart, d(411)},
		{"prepared root past its own half-life: activate before it ages out", state(a, root(t, d(-300), d(430), prepared, d(-300))), d(10), rotation.StepActivate, d(340)},
		{"retiring: remove at retiringSince + LeafMaxTTL + margin",
			state(root(t, d(-365), d(365), retiring, d(243)), root(t, t0, d(730), active, d(243))), d(243),
			rotation.StepRemove, d(243 + 90).Add(time.Hour)},
		{"two retiring: the longest retiring first",
			state(root(t, t0, d(730), retiring, d(10)), root(t, t0, d(730), retiring, d(5)), a), d(5),
			rotation.StepRemove, d(95).Add(time.Hour)},
		{"clock set back: activation not early", state(a, next(365)), t0, rotation.StepActivate, d(730 * 5.0 / 6)},
		{"clock set back before preparation: still waits for propagation", state(a, next(620)), t0, rotation.StepActivate, d(621)},
		{"10-year root: prepare so the new 2-year root outlives its leaves", state(root(t, t0, d(3650), active, t0)), t0,
			rotation.StepPrepare, d(3650*5.0/6 + 90 - 730)},
		{"1-year root: hand over while it outlives a leaf, before 5/6", state(root(t, t0, d(365), active, t0), next(182.5)), d(183),
			rotation.StepActivate, d(365 - 90)},
		{"no active root: nothing", castate.State{}, t0, rotation.StepNone, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			step, at := rotation.Plan(tt.state, tt.now, p)
			if step != tt.step || !near(at, tt.at) {
				t.Errorf("Plan = %s at %v (day %.3f), want %s at %v", step, at, at.Sub(t0).Hours()/24, tt.step, tt.at)
			}
		})
	}
}

func TestApply(t *testing.T) {
	now := t0.Add(100 * day)
	r, a, pr := root(t, t0, t0.Add(730*day), retiring, t0), root(t, t0, t0.Add(730*day), active, t0), root(t, t0, t0.Add(730*day), prepared, t0)
	fresh := generator(730 * day)
	m, err := fresh(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		in   castate.State
		step rotation.Step
		want []castate.Status
	}{
		{"prepare appends", state(r, a), rotation.StepPrepare, []castate.Status{retiring, active, prepared}},
		{"activate swaps in one write", state(r, a, pr), rotation.StepActivate, []castate.Status{retiring, retiring, active}},
		{"retire-start abandons the prepared", state(a, pr), rotation.StepRetireStart, []castate.Status{active, retiring}},
		{"remove drops the longest retiring", state(r, a), rotation.StepRemove, []castate.Status{active}},
		{"prepare with one prepared: unchanged", state(a, pr), rotation.StepPrepare, []castate.Status{active, prepared}},
		{"activate without prepared: unchanged", state(r, a), rotation.StepActivate, []castate.Status{retiring, active}},
		{"remove without retiring: unchanged", state(a), rotation.StepRemove, []castate.Status{active}},
		{"none: unchanged", state(a, pr), rotation.StepNone, []castate.Status{active, prepared}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := statuses(tt.in)
			got := rotation.Apply(tt.in, tt.step, now, m)
			if s := statuses(got); !slices.Equal(s, tt.want) {
				t.Errorf("statuses after %s = %v, want %v", tt.step, s, tt.want)
			}
			if !slices.Equal(statuses(tt.in), before) {
				t.Error("Apply modified its input")
			}
			if err := got.Validate(); err != nil {
				t.Errorf("result is invalid: %v", err)
			}
		})
	}
	t.Run("times", func(t *testing.T) {
		got := rotation.Apply(state(r, a, pr), rotation.StepActivate, now, nil)
		if !got.Authorities[1].RetiringSince.Equal(now) || !got.Authorities[2].ActivatedAt.Equal(now) {
			t.Error("activate must date the handover on both roots")
		}
		got = rotation.Apply(state(a), rotation.StepPrepare, now, m)
		if p := got.Authorities[1]; p.Cert != m.Cert || p.Key != m.Signer || !p.PreparedAt.Equal(now) {
			t.Error("prepare must add the new material, dated now")
		}
		if got := rotation.Apply(state(a), rotation.StepPrepare, now, nil); len(got.Authorities) != 1 {
			t.Error("prepare without material changed the state")
		}
	})
}

func statuses(s castate.State) []castate.Status {
	out := make([]castate.Status, len(s.Authorities))
	for i, a := range s.Authorities {
		out[i] = a.Status
	}
	return out
}

// TestPlanPreview: a preview stage delays activation by its length (the
// propagation delay counts from when the root goes live) and moves the
// preparation earlier by as much, and Previewing names the root while it
// lasts.
func TestPlanPreview(t *testing.T) {
	p := rotation.DefaultPolicy()
	p.LeafMaxTTL, p.Preview = 90*day, 2*day
	d := func(days float64) time.Time { return t0.Add(time.Duration(days * float64(day))) }
	a := root(t, t0, d(730), active, t0)
	late := root(t, d(620).Add(-time.Hour), d(1350), prepared, d(620))
	tests := []planCase{
		{"prepared late: preview, then propagation", state(a, late), d(620), rotation.StepActivate, d(623)},
		{"prepared on time: 5/6 still wins", state(a, root(t, d(365), d(1095), prepared, d(365))), d(365), rotation.StepActivate, d(730 * 5.0 / 6)},
		{"120-day root: prepare preview + propagation before the hand-over",
			state(root(t, t0, d(120), active, t0)), t0, rotation.StepPrepare, d(27)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			step, at := rotation.Plan(tt.state, tt.now, p)
			if step != tt.step || !near(at, tt.at) {
				t.Errorf("Plan = %s at %v (day %.3f), want %s at day %.3f", step, at, at.Sub(t0).Hours()/24, tt.step, tt.at.Sub(t0).Hours()/24)
			}
		})
	}
	previewing := []struct {
		name   string
		state  castate.State
		now    time.Time
		policy time.Duration
		want   int
		until  time.Time
	}{
		{"in preview", state(a, late), d(621), p.Preview, 1, d(622)},
		{"live after the preview", state(a, late), d(622), p.Preview, 0, time.Time{}},
		{"no preview stage", state(a, late), d(621), 0, 0, time.Time{}},
		{"steady", state(a), d(621), p.Preview, 0, time.Time{}},
		{"intermediates have none", castate.State{Kind: castate.KindIntermediates, Authorities: []castate.Authority{a, late}}, d(621), p.Preview, 0, time.Time{}},
	}
	for _, tt := range previewing {
		t.Run("Previewing: "+tt.name, func(t *testing.T) {
			q := p
			q.Preview = tt.policy
			got, until := rotation.Previewing(tt.state, tt.now, q)
			if len(got) != tt.want || !until.Equal(tt.until) {
				t.Errorf("Previewing = %d roots until %v, want %d until %v", len(got), until, tt.want, tt.until)
			}
		})
	}
}
