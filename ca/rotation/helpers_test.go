package rotation_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/internal/testca"
)

const day = 24 * time.Hour

var (
	testTD = spiffeid.RequireTrustDomainFromString("example.org")
	// t0 is the fixed time tests start at.
	t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
)

// generator returns a Generate function making roots of lifetime d.
func generator(d time.Duration) func(context.Context, time.Time) (*ca.Material, error) {
	return func(_ context.Context, now time.Time) (*ca.Material, error) {
		return keystore.GenerateRoot(keystore.GenerateOptions{TrustDomain: testTD, Lifetime: d}, now)
	}
}

// root returns an authority with a new root valid from notBefore to
// notAfter, and status st dated at.
func root(t testing.TB, notBefore, notAfter time.Time, st castate.Status, at time.Time) castate.Authority {
	t.Helper()
	c := testca.NewRoot(t, testca.P256, testca.Validity(notBefore, notAfter))
	a := castate.Authority{Cert: c.Cert, Key: c.Key, Status: st, PreparedAt: at}
	switch st {
	case castate.StatusActive:
		a.ActivatedAt = at
	case castate.StatusRetiring:
		a.ActivatedAt, a.RetiringSince = at, at
	}
	return a
}

func state(as ...castate.Authority) castate.State {
	return castate.State{Authorities: as}
}

// memStore is an in-memory rotation.Store that serializes through
// castate.Encode and Decode, like the Secret.
type memStore struct {
	mu       sync.Mutex
	data     map[string][]byte
	writes   int
	stale    *castate.State // if set, Current returns it: a lagging follower
	failures int            // Update fails this many more times
	onChange []func()
}

func newMemStore(t testing.TB, s castate.State) *memStore {
	t.Helper()
	data, err := castate.Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	return &memStore{data: data}
}

func (m *memStore) Update(_ context.Context, fn func(castate.State) (castate.State, error)) error {
	changed, err := m.update(fn)
	if changed {
		for _, f := range m.onChange {
			f()
		}
	}
	return err
}

func (m *memStore) update(fn func(castate.State) (castate.State, error)) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failures > 0 {
		m.failures--
		return false, errors.New("apiserver unavailable")
	}
	cur, err := castate.Decode(m.data)
	if err != nil {
		return false, err
	}
	next, err := fn(cur)
	if err != nil {
		return false, err
	}
	data, err := castate.Encode(next)
	if err != nil || bytes.Equal(data[castate.KeyState], m.data[castate.KeyState]) {
		return false, err
	}
	m.data = data
	m.writes++
	return true, nil
}

func (m *memStore) Current() castate.State {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stale != nil {
		return *m.stale
	}
	s, _ := castate.Decode(m.data)
	return s
}

// state returns the stored state, ignoring stale.
func (m *memStore) state() castate.State {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, _ := castate.Decode(m.data)
	return s
}

func (m *memStore) writeCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.writes
}

// recorder is a rotation.Observer that remembers what it was told.
type recorder struct {
	mu      sync.Mutex
	rotated []string
}

func (r *recorder) Rotated(step string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rotated = append(r.rotated, step)
}

func (r *recorder) taken() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rotated)
}

func (r *recorder) steps() string {
	return strings.Join(r.taken(), ",")
}

// near reports whether a and b are within a millisecond: fractions of a
// lifetime are computed in floating point.
func near(a, b time.Time) bool {
	d := a.Sub(b)
	return -time.Millisecond <= d && d <= time.Millisecond
}

var _ rotation.Store = (*memStore)(nil)
var _ rotation.Store = (*castate.SecretStore)(nil)

// planCase is one case of a Plan table: in state at now, step is next, due
// at at.
type planCase struct {
	name  string
	state castate.State
	now   time.Time
	step  rotation.Step
	at    time.Time
}
