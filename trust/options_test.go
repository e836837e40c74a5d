package trust

import (
	"crypto/x509"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/internal/contest"
)

func TestOptionsWithDefaults(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	roots := func() []*x509.Certificate { return nil }
	long := spiffeid.RequireTrustDomainFromString(strings.Repeat("a", 64) + ".org")
	for _, tc := range []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{"defaults", Options{TrustDomain: td, Roots: roots}, ""},
		{"no roots", Options{TrustDomain: td}, "missing Roots"},
		{"no trust domain", Options{Roots: roots}, "missing TrustDomain"},
		{"trust domain too long for a label", Options{TrustDomain: long, Roots: roots}, "label value"},
		{"negative resync", Options{TrustDomain: td, Roots: roots, ResyncPeriod: -1}, "negative"},
		{"negative repair interval", Options{TrustDomain: td, Roots: roots, RepairInterval: -1}, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.opts.WithDefaults()
			if tc.wantErr == "" {
				if err != nil || got.ResyncPeriod != DefaultResyncPeriod || got.RepairInterval != contest.DefaultInterval ||
					got.Observer == nil || got.Logger == nil || got.Clock == nil {
					t.Fatalf("WithDefaults = %+v, %v; want every default", got, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("WithDefaults error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
