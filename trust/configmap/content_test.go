package configmap

import (
	"crypto/x509"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/workload-ca/workload-ca/trust"
)

func TestNew(t *testing.T) {
	client := fake.NewClientset()
	roots := func() []*x509.Certificate { return nil }
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"defaults", Config{Client: client, Options: trust.Options{TrustDomain: testTD, Roots: roots}}, ""},
		{"no client", Config{Options: trust.Options{TrustDomain: testTD, Roots: roots}}, "missing Client"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.cfg)
			if tc.wantErr == "" {
				if err != nil || p.opts.ResyncPeriod != trust.DefaultResyncPeriod || !p.selector.Empty() {
					t.Fatalf("New = %v; want defaults (resync %v, selector %q)", err, p.opts.ResyncPeriod, p.selector)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("New error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
