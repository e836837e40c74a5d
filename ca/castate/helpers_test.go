package castate_test

import (
	"context"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/ca/keystore"
)

var (
	testTD = spiffeid.RequireTrustDomainFromString("example.org")
	// t0 is the fixed time tests date authorities at.
	t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
)

// generate is a SecretConfig.Generate for tests: a P-256 root for a year.
func generate(_ context.Context, now time.Time) (*ca.Material, error) {
	return keystore.GenerateRoot(keystore.GenerateOptions{TrustDomain: testTD, Lifetime: 365 * 24 * time.Hour}, now)
}

func newRoot(t testing.TB) *ca.Material {
	t.Helper()
	m, err := generate(context.Background(), t0)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// authority returns a new root with status st and the timestamps it needs.
func authority(t testing.TB, st castate.Status) castate.Authority {
	t.Helper()
	m := newRoot(t)
	a := castate.Authority{Cert: m.Cert, Key: m.Signer, Status: st, PreparedAt: t0}
	switch st {
	case castate.StatusActive:
		a.ActivatedAt = t0.Add(time.Hour)
	case castate.StatusRetiring:
		a.ActivatedAt, a.RetiringSince = t0.Add(time.Hour), t0.Add(2*time.Hour)
	}
	return a
}

// stateOf returns a state with one new authority per status, in order.
func stateOf(t testing.TB, statuses ...castate.Status) castate.State {
	t.Helper()
	var s castate.State
	for _, st := range statuses {
		s.Authorities = append(s.Authorities, authority(t, st))
	}
	return s
}

func mustEncode(t testing.TB, s castate.State) map[string][]byte {
	t.Helper()
	data, err := castate.Encode(s)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	return data
}

// sameState reports whether a and b encode identically.
func sameState(t testing.TB, a, b castate.State) bool {
	t.Helper()
	return string(mustEncode(t, a)[castate.KeyState]) == string(mustEncode(t, b)[castate.KeyState])
}
