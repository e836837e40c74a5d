package rotation_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/ca/rotation"
)

// regular is four rotations, each old root removed before the next is
// prepared; simulate stops at the fourth activation.
const regular = "prepare,activate,remove,prepare,activate,remove,prepare,activate,remove,prepare,activate"

// TestLifecycle runs Plan and Apply through several rotations, taking each
// step when it is due (or late), and checks the guarantees at every step.
func TestLifecycle(t *testing.T) {
	tests := []struct {
		name     string
		policy   rotation.Policy
		lateness time.Duration // how long after its time each step is taken
		want     string
	}{
		{"default policy, punctual leader", rotation.DefaultPolicy(), 0, regular},
		{"default policy, leader a week late", rotation.DefaultPolicy(), 7 * day, regular},
		{"30-day CA, 1-day leaves", rotation.Policy{CATTL: 30 * day, LeafMaxTTL: day, PropagationDelay: time.Hour}, 0, regular},
		// The old root leaves the bundle after the next one is prepared.
		{"tightest valid policy", rotation.Policy{CATTL: 200 * day, LeafMaxTTL: 99 * day, PropagationDelay: day}, 0,
			"prepare,activate,prepare,remove,activate,prepare,remove,activate,prepare,remove,activate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := tt.policy.WithDefaults()
			if err != nil {
				t.Fatal(err)
			}
			if steps := simulate(t, p, tt.lateness, 4); steps != tt.want {
				t.Errorf("steps = %s\nwant    %s", steps, tt.want)
			}
		})
	}
}

// simulate rotates until rotations activations have happened and returns
// the steps taken, comma-separated.
func simulate(t *testing.T, p rotation.Policy, lateness time.Duration, rotations int) string {
	gen := generator(p.CATTL)
	first, err := gen(context.Background(), t0)
	if err != nil {
		t.Fatal(err)
	}
	s := state(castate.Authority{Cert: first.Cert, Key: first.Signer, Status: active, PreparedAt: t0, ActivatedAt: t0})
	now, activations, steps := t0, 0, []string{}
	for activations < rotations {
		step, at := rotation.Plan(s, now, p)
		if step == rotation.StepNone || len(steps) > 10*rotations {
			t.Fatalf("stuck after %v", steps)
		}
		if at.After(now) {
			now = at.Add(lateness)
		}
		m, err := gen(context.Background(), now)
		if err != nil {
			t.Fatal(err)
		}
		next := rotation.Apply(s, step, now, m)
		if err := next.Validate(); err != nil {
			t.Fatalf("after %s: %v", step, err)
		}
		checkStep(t, p, s, next, step, now, lateness)
		if step == rotation.StepActivate {
			activations++
		}
		s, steps = next, append(steps, string(step))
	}
	return strings.Join(steps, ",")
}

// checkStep checks the guarantees of one step from before to after at now.
func checkStep(t *testing.T, p rotation.Policy, before, after castate.State, step rotation.Step, now time.Time, lateness time.Duration) {
	t.Helper()
	if n := len(after.Authorities); n > 3 {
		t.Errorf("%v: %d roots in the bundle", now, n)
	}
	for _, a := range after.Authorities {
		if a.Status == retiring && a.Key != nil {
			t.Errorf("%v: after %s a retiring root still holds its key", now, step)
		}
	}
	switch step {
	case rotation.StepActivate:
		old, cur := before.Active(), after.Active()
		if cur.PreparedAt.Add(p.PropagationDelay).After(now) {
			t.Errorf("%v: activated a root prepared at %v, before PropagationDelay", now, cur.PreparedAt)
		}
		if cur.Cert.NotAfter.Before(now.Add(p.LeafMaxTTL)) {
			t.Errorf("%v: the new root cannot outlive a leaf", now)
		}
		if late := now.Add(p.LeafMaxTTL).Sub(old.Cert.NotAfter); late > lateness {
			t.Errorf("%v: the old root signed %v past the point where it outlives a leaf", now, late)
		}
	case rotation.StepRemove:
		for _, a := range before.Authorities {
			gone := a.Status == retiring && !contains(after, a)
			if gone && now.Before(a.RetiringSince.Add(p.LeafMaxTTL+p.SkewMargin)) {
				t.Errorf("%v: removed a root retiring since %v, while its leaves may be valid", now, a.RetiringSince)
			}
		}
	case rotation.StepRetireStart:
		t.Errorf("%v: abandoned a prepared root in a regular rotation", now)
	}
}

func contains(s castate.State, a castate.Authority) bool {
	for _, x := range s.Authorities {
		if x.Cert.Equal(a.Cert) {
			return true
		}
	}
	return false
}
