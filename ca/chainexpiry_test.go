package ca_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// TestIntermediateOutlivingItsUpstreamChain: an
// intermediate may outlive the upstream chain above it. Every leaf is
// clamped to the first expiry of the whole chain (the intermediate, the
// certificates above it, the root), and once any of them has expired the
// CA neither signs nor passes its probe, naming the certificate.
func TestIntermediateOutlivingItsUpstreamChain(t *testing.T) {
	now := testNow()
	tests := []struct {
		name string
		// rootLeft, midLeft, oursLeft are each certificate's lifetime left;
		// midLeft 0: the intermediate is issued by the root directly.
		rootLeft, midLeft, oursLeft time.Duration
		wantLeft                    time.Duration // of the leaf asked for an hour
		expiring                    string        // the CN prefix of the first to expire
	}{
		{name: "root expires first", rootLeft: 20 * time.Minute, oursLeft: 2 * time.Hour, wantLeft: 20 * time.Minute, expiring: "testca root"},
		{name: "upstream intermediate expires first", rootLeft: 3 * time.Hour, midLeft: 10 * time.Minute, oursLeft: 2 * time.Hour,
			wantLeft: 10 * time.Minute, expiring: "testca intermediate"},
		{name: "our intermediate expires first", rootLeft: 3 * time.Hour, midLeft: 3 * time.Hour, oursLeft: 30 * time.Minute,
			wantLeft: 30 * time.Minute, expiring: "testca intermediate"},
		{name: "nothing expires within the leaf's lifetime", rootLeft: 3 * time.Hour, oursLeft: 2 * time.Hour, wantLeft: time.Hour,
			expiring: "testca intermediate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			valid := func(left time.Duration) testca.Option { return testca.Validity(now.Add(-time.Hour), now.Add(left)) }
			issuer := testca.NewRoot(t, testca.P256, valid(tt.rootLeft))
			if tt.midLeft > 0 {
				issuer = testca.NewIntermediate(t, issuer, testca.P256, valid(tt.midLeft))
			}
			ours := testca.NewIntermediate(t, issuer, testca.P256, valid(tt.oursLeft))
			clk := clocktesting.NewFakeClock(now)
			a, err := ca.New(ca.Config{TrustDomain: td, Clock: clk, MaxTTL: 24 * time.Hour}, ours.Material())
			if err != nil {
				t.Fatal(err)
			}
			leaf := signZtunnel(t, a, time.Hour)
			if got := leaf.Cert.NotAfter.Sub(now); got != tt.wantLeft {
				t.Errorf("leaf valid for %v, want %v", got, tt.wantLeft)
			}
			verifySVID(t, leaf.Chain, leaf.Cert.NotAfter) // valid to its last second
			end, first := a.ChainNotAfter()
			if !end.Equal(now.Add(min(tt.rootLeft, tt.oursLeft, orMax(tt.midLeft)))) || !strings.HasPrefix(first.Subject.CommonName, tt.expiring) {
				t.Errorf("ChainNotAfter = %v, %q", end, first.Subject.CommonName)
			}
			if err := a.Probe(t.Context()); err != nil {
				t.Fatalf("Probe = %v", err)
			}

			clk.SetTime(end.Add(time.Second))
			if err := a.Probe(t.Context()); !errors.Is(err, ca.ErrExpired) || !strings.Contains(err.Error(), first.Subject.CommonName) {
				t.Errorf("Probe after %s expired = %v, want ErrExpired naming it", first.Subject.CommonName, err)
			}
			csrPEM, _ := testca.ZtunnelCSR(t, workload)
			if _, err := a.Sign(context.Background(), ca.Request{CSR: parseCSR(t, csrPEM), ID: workload}); !errors.Is(err, ca.ErrExpired) {
				t.Errorf("Sign after %s expired = %v, want ErrExpired", first.Subject.CommonName, err)
			}
		})
	}
}

func orMax(d time.Duration) time.Duration {
	if d == 0 {
		return 1<<63 - 1
	}
	return d
}
