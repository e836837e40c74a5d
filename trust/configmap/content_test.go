package configmap

import (
	"crypto/x509"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes/fake"
)

func TestNew(t *testing.T) {
	client := fake.NewClientset()
	roots := func() []*x509.Certificate { return nil }
	long := spiffeid.RequireTrustDomainFromString(strings.Repeat("a", 64) + ".org")
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"defaults", Config{Client: client, TrustDomain: testTD, Roots: roots}, ""},
		{"no client", Config{TrustDomain: testTD, Roots: roots}, "missing Client"},
		{"no roots", Config{Client: client, TrustDomain: testTD}, "missing Roots"},
		{"no trust domain", Config{Client: client, Roots: roots}, "missing TrustDomain"},
		{"trust domain too long for a label", Config{Client: client, TrustDomain: long, Roots: roots}, "label value"},
		{"negative resync", Config{Client: client, TrustDomain: testTD, Roots: roots, ResyncPeriod: -1}, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.cfg)
			if tc.wantErr == "" {
				if err != nil || p.resync != DefaultResyncPeriod || !p.selector.Empty() {
					t.Fatalf("New = %v; want defaults (resync %v, selector %q)", err, p.resync, p.selector)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("New error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
