package source

import (
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// TestUpstreamReadyWatchesTheWholeChain: a replica
// is not ready once the upstream root above the intermediate, not only the
// intermediate, is within ReadyMargin of its expiry, and says which.
func TestUpstreamReadyWatchesTheWholeChain(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Second)
	valid := func(left time.Duration) testca.Option { return testca.Validity(now.Add(-time.Hour), now.Add(left)) }
	tests := []struct {
		name            string
		rootLeft, left  time.Duration
		wantErrContains string // empty: ready
	}{
		{"intermediate and root far from expiry", 48 * time.Hour, 24 * time.Hour, ""},
		{"intermediate within the margin", 48 * time.Hour, 30 * time.Minute, "the upstream intermediate expires in 30m0s"},
		{"root within the margin, intermediate not", 30 * time.Minute, 24 * time.Hour, "the upstream chain's certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := testca.NewRoot(t, testca.P256, valid(tt.rootLeft))
			inter := testca.NewIntermediate(t, root, testca.P256, valid(tt.left))
			a, err := ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("example.org"),
				Clock: testingclock.NewFakePassiveClock(now)}, inter.Material())
			if err != nil {
				t.Fatal(err)
			}
			s := &Source{cfg: Config{ReadyMargin: time.Hour, Now: func() time.Time { return now }}, authority: a}
			err = s.upstreamReady(t.Context())
			switch {
			case tt.wantErrContains == "" && err != nil:
				t.Fatalf("upstreamReady = %v, want ready", err)
			case tt.wantErrContains != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErrContains)):
				t.Fatalf("upstreamReady = %v, want an error containing %q", err, tt.wantErrContains)
			}
		})
	}
}
