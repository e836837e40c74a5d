package ca_test

import (
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestConfigDefaults(t *testing.T) {
	tests := []struct {
		name    string
		cfg     ca.Config
		wantTTL time.Duration // lifetime of a certificate asked with no TTL
		wantErr bool
	}{
		{"all defaults", ca.Config{TrustDomain: td}, 24 * time.Hour, false},
		{"max under the default TTL lowers the default", ca.Config{TrustDomain: td, MaxTTL: time.Hour}, time.Hour, false},
		{"explicit default over the max", ca.Config{TrustDomain: td, DefaultTTL: 2 * time.Hour, MaxTTL: time.Hour}, 0, true},
		{"no trust domain", ca.Config{}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := ca.New(tt.cfg, testca.NewRoot(t, testca.P256).Material())
			if (err != nil) != tt.wantErr {
				t.Fatalf("New error = %v, want error %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			leaf := signZtunnel(t, a, 0).Cert
			if got := leaf.NotAfter.Sub(leaf.NotBefore) - ca.DefaultBackdate; got.Round(time.Second) != tt.wantTTL {
				t.Errorf("lifetime = %v, want %v", got, tt.wantTTL)
			}
		})
	}
}
