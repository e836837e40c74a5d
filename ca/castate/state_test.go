package castate_test

import (
	"crypto/x509"
	"errors"
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/internal/testca"
)

const (
	prepared = castate.StatusPrepared
	active   = castate.StatusActive
	retiring = castate.StatusRetiring
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		state func(t *testing.T) castate.State
		ok    bool
	}{
		{"one active", func(t *testing.T) castate.State { return stateOf(t, active) }, true},
		{"mid rotation", func(t *testing.T) castate.State { return stateOf(t, retiring, retiring, active, prepared) }, true},
		{"empty", func(*testing.T) castate.State { return castate.State{} }, false},
		{"too many", func(t *testing.T) castate.State {
			return stateOf(t, slices.Repeat([]castate.Status{retiring}, castate.MaxAuthorities)...)
		}, false},
		{"no active", func(t *testing.T) castate.State { return stateOf(t, retiring, prepared) }, false},
		{"two active", func(t *testing.T) castate.State { return stateOf(t, active, active) }, false},
		{"two prepared", func(t *testing.T) castate.State { return stateOf(t, active, prepared, prepared) }, false},
		{"unknown status", func(t *testing.T) castate.State { return edit(stateOf(t, active, prepared), 1, setStatus("next")) }, false},
		{"key of another root", func(t *testing.T) castate.State {
			s := stateOf(t, active, prepared)
			return edit(s, 0, func(a *castate.Authority) { a.Key = s.Authorities[1].Key })
		}, false},
		{"duplicate certificate", func(t *testing.T) castate.State {
			s := stateOf(t, active)
			dup := s.Authorities[0]
			dup.Status, dup.ActivatedAt, dup.RetiringSince = retiring, t0, t0
			s.Authorities = append(s.Authorities, dup)
			return s
		}, false},
		{"same key, new certificate", func(t *testing.T) castate.State {
			s := stateOf(t, active)
			a := s.Authorities[0]
			tmpl := *a.Cert
			tmpl.SerialNumber = new(big.Int).Add(a.Cert.SerialNumber, big.NewInt(1))
			again := castate.Authority{Cert: testca.Sign(t, &tmpl, &tmpl, a.Key.Public(), a.Key),
				Key: a.Key, Status: prepared, PreparedAt: t0}
			s.Authorities = append(s.Authorities, again)
			return s
		}, false},
		{"not a CA", func(t *testing.T) castate.State {
			root := testca.NewRoot(t, testca.P256, func(c *x509.Certificate) { c.IsCA = false })
			return castate.State{Authorities: []castate.Authority{{Cert: root.Cert, Key: root.Key, Status: active, ActivatedAt: t0}}}
		}, false},
		{"no certSign", func(t *testing.T) castate.State {
			root := testca.NewRoot(t, testca.P256, func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature })
			return castate.State{Authorities: []castate.Authority{{Cert: root.Cert, Key: root.Key, Status: active, ActivatedAt: t0}}}
		}, false},
		{"intermediate, not self-signed", func(t *testing.T) castate.State {
			in := testca.NewIntermediate(t, testca.NewRoot(t, testca.P256), testca.P256)
			return castate.State{Authorities: []castate.Authority{{Cert: in.Cert, Key: in.Key, Status: active, ActivatedAt: t0}}}
		}, false},
		{"missing key", func(t *testing.T) castate.State {
			return edit(stateOf(t, active), 0, func(a *castate.Authority) { a.Key = nil })
		}, false},
		{"active without activatedAt", func(t *testing.T) castate.State {
			return edit(stateOf(t, active), 0, func(a *castate.Authority) { a.ActivatedAt = time.Time{} })
		}, false},
		{"prepared with activatedAt", func(t *testing.T) castate.State {
			return edit(stateOf(t, active, prepared), 1, func(a *castate.Authority) { a.ActivatedAt = t0 })
		}, false},
		{"retiring without retiringSince", func(t *testing.T) castate.State {
			return edit(stateOf(t, retiring, active), 0, func(a *castate.Authority) { a.RetiringSince = time.Time{} })
		}, false},
		{"abandoned prepared, never active", func(t *testing.T) castate.State {
			return edit(stateOf(t, retiring, active), 0, func(a *castate.Authority) { a.ActivatedAt = time.Time{} })
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.state(t).Validate()
			t.Log(err)
			if tt.ok && err != nil {
				t.Fatalf("Validate = %v, want nil", err)
			}
			if !tt.ok && !errors.Is(err, castate.ErrInvalidState) {
				t.Fatalf("Validate = %v, want ErrInvalidState", err)
			}
		})
	}
}

func TestMaterial(t *testing.T) {
	s := stateOf(t, retiring, active, prepared)
	m, err := s.Material()
	if err != nil {
		t.Fatal(err)
	}
	want := s.Authorities[1]
	if m.Cert != want.Cert || m.Signer != want.Key || len(m.Intermediates) != 0 {
		t.Error("Material does not sign with the active authority alone")
	}
	for i, r := range m.Roots {
		if r != s.Authorities[i].Cert {
			t.Errorf("root %d is not authority %d's certificate: want every root, oldest first", i, i)
		}
	}
	if err := m.Validate(t0); err != nil {
		t.Errorf("ca.Material.Validate: %v", err)
	}
	if _, err := (castate.State{}).Material(); !errors.Is(err, castate.ErrInvalidState) {
		t.Errorf("Material of an empty state = %v, want ErrInvalidState", err)
	}
}

func TestPhase(t *testing.T) {
	tests := []struct {
		statuses []castate.Status
		want     string
	}{
		{[]castate.Status{active}, castate.PhaseSteady},
		{[]castate.Status{active, prepared}, castate.PhasePrepared},
		{[]castate.Status{retiring, active}, castate.PhaseRetiring},
		{[]castate.Status{retiring, active, prepared}, castate.PhasePrepared},
	}
	for _, tt := range tests {
		if got := stateOf(t, tt.statuses...).Phase(); got != tt.want {
			t.Errorf("Phase of %v = %q, want %q", tt.statuses, got, tt.want)
		}
	}
	if got := stateOf(t, active).Active().Status; got != active {
		t.Errorf("Active().Status = %q", got)
	}
}

// edit returns s with authority i changed by f; s is not modified.
func edit(s castate.State, i int, f func(*castate.Authority)) castate.State {
	s.Authorities = slices.Clone(s.Authorities)
	f(&s.Authorities[i])
	return s
}

func setStatus(st castate.Status) func(*castate.Authority) {
	return func(a *castate.Authority) { a.Status = st }
}
