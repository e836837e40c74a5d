package rotation_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/rotation"
)

func TestDefaultPolicy(t *testing.T) {
	p := rotation.DefaultPolicy()
	if err := p.Validate(); err != nil {
		t.Fatalf("default policy invalid: %v", err)
	}
	if p.LeafMaxTTL < ca.DefaultMaxTTL {
		t.Errorf("LeafMaxTTL %v is below the CA's default MaxTTL %v: leaves could outlive their root", p.LeafMaxTTL, ca.DefaultMaxTTL)
	}
	// The SPIRE fractions hold: at 5/6 the old root still outlives a leaf.
	if after := time.Duration(float64(p.CATTL) / 6); after < p.LeafMaxTTL {
		t.Errorf("1/6 of CATTL (%v) is less than LeafMaxTTL (%v)", after, p.LeafMaxTTL)
	}
}

func TestPolicyValidate(t *testing.T) {
	tests := []struct {
		name string
		p    rotation.Policy
		ok   bool
	}{
		{"exactly enough room", rotation.Policy{CATTL: 200 * day, LeafMaxTTL: 99 * day, PropagationDelay: day}, true},
		{"CA too short for its leaves", rotation.Policy{CATTL: 180 * day, LeafMaxTTL: 90 * day}, false},
		{"CA shorter than a leaf", rotation.Policy{CATTL: 30 * day, LeafMaxTTL: 31 * day}, false},
		{"prepare after activate", rotation.Policy{PrepareAt: 0.9, ActivateAt: 0.8}, false},
		{"activate at the end", rotation.Policy{ActivateAt: 1}, false},
		{"negative fraction", rotation.Policy{PrepareAt: -0.5}, false},
		{"NaN fraction", rotation.Policy{ActivateAt: math.NaN()}, false},
		{"negative propagation", rotation.Policy{PropagationDelay: -time.Second}, false},
		{"negative leaf TTL", rotation.Policy{LeafMaxTTL: -time.Second}, false},
		{"negative margin", rotation.Policy{SkewMargin: -time.Second}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.p.WithDefaults()
			if (err == nil) != tt.ok {
				t.Fatalf("WithDefaults = %v, want ok %v", err, tt.ok)
			}
		})
	}
}

// A CA lifetime too short to rotate says how short, and the least that
// works: the callers name their own settings with it.
func TestPolicyTooShort(t *testing.T) {
	p := rotation.Policy{CATTL: 48 * time.Hour, LeafMaxTTL: 47 * time.Hour, PropagationDelay: 24 * time.Hour,
		PrepareAt: 0.5, ActivateAt: 5.0 / 6}
	var short *rotation.TooShortError
	if err := p.Validate(); !errors.As(err, &short) {
		t.Fatalf("Validate = %v; want a TooShortError", err)
	}
	if short.Need != 71*time.Hour || short.Room != 24*time.Hour || short.Least != 142*time.Hour {
		t.Errorf("TooShortError %+v; want need 71h, room 24h, least 142h", short)
	}
	p.CATTL = short.Least
	if err := p.Validate(); err != nil {
		t.Errorf("the least lifetime it names is refused: %v", err)
	}
}
