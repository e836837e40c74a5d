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
