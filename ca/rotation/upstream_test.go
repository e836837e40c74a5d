package rotation_test

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// An upstream intermediate under the anchor the bundle already holds
// signs as soon as it is prepared; one under an anchor the upstream moved
// to waits the propagation delay, as a new root does.
func TestPlanUpstream(t *testing.T) {
	p, err := rotation.Policy{CATTL: 730 * day, LeafMaxTTL: day, PropagationDelay: day}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	oldRoot, newRoot := pluginRoot(t, t0.Add(-day), t0.Add(3650*day)), pluginRoot(t, t0.Add(-day), t0.Add(3650*day))
	upstreamInter := func(issuer *testca.CA, notBefore time.Time, st castate.Status) castate.Authority {
		a := inter(t, issuer, notBefore, notBefore.Add(730*day), st, notBefore)
		a.Chain = []*x509.Certificate{issuer.Cert}
		return a
	}
	active := upstreamInter(oldRoot, t0, castate.StatusActive)
	// Prepared late, after the scheduled hand-over: it is due as soon as
	// it may sign.
	preparedAt := t0.Add(700 * day)
	tests := []struct {
		name   string
		issuer *testca.CA
		want   time.Time
	}{
		{"same anchor: activates at once", oldRoot, preparedAt},
		{"new anchor: waits the propagation delay", newRoot, preparedAt.Add(day)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := castate.State{Kind: castate.KindUpstream, Authorities: []castate.Authority{active, upstreamInter(tt.issuer, preparedAt, castate.StatusPrepared)}}
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
			step, at := rotation.Plan(s, preparedAt, p)
			if step != rotation.StepActivate || !at.Equal(tt.want) {
				t.Fatalf("Plan = %s at %v, want activate at %v", step, at, tt.want)
			}
		})
	}
}

// TestPlanFromTheUpstreamChainsFirstExpiry: an
// upstream root that expires before the intermediate ends the
// intermediate's use, so the rotation prepares and activates the
// successor relative to the root's expiry, not the intermediate's.
func TestPlanFromTheUpstreamChainsFirstExpiry(t *testing.T) {
	p, err := rotation.Policy{CATTL: 730 * day, LeafMaxTTL: day, PropagationDelay: day}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	// The intermediate lives 720 days, the upstream root only 360 of them.
	shortRoot := pluginRoot(t, t0.Add(-day), t0.Add(360*day))
	longRoot := pluginRoot(t, t0.Add(-day), t0.Add(3650*day))
	for _, tt := range []struct {
		name        string
		root        *testca.CA
		wantPrepare time.Time // half-life of the span
	}{
		{"the root outlives the intermediate: half of its 720 days", longRoot, t0.Add(360 * day)},
		{"the root expires first: half of the root's 360 days", shortRoot, t0.Add(180 * day)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			active := inter(t, tt.root, t0, t0.Add(720*day), castate.StatusActive, t0)
			active.Chain = []*x509.Certificate{tt.root.Cert}
			s := castate.State{Kind: castate.KindUpstream, Authorities: []castate.Authority{active}}
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
			step, at := rotation.Plan(s, t0, p)
			if step != rotation.StepPrepare || !at.Equal(tt.wantPrepare) {
				t.Fatalf("Plan = %s at %v, want prepare at %v", step, at, tt.wantPrepare)
			}
			// The successor, prepared then, activates at 5/6 of the span.
			next := inter(t, longRoot, at, at.Add(720*day), castate.StatusPrepared, at)
			next.Chain = []*x509.Certificate{longRoot.Cert}
			s.Authorities = append(s.Authorities, next)
			end := rotation.ChainNotAfter(active.Cert, active.Chain)
			wantActivate := t0.Add(end.Sub(t0) * 5 / 6)
			if step, at := rotation.Plan(s, at, p); step != rotation.StepActivate || !at.Equal(wantActivate) {
				t.Fatalf("Plan with the successor = %s at %v, want activate at %v", step, at, wantActivate)
			}
		})
	}
}
