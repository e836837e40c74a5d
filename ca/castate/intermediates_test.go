package castate_test

import (
	"context"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/internal/testlog"

	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// pluginRoot returns an operator's root CA, valid around t0 for ten years.
func pluginRoot(t testing.TB) *testca.CA {
	t.Helper()
	return testca.NewRoot(t, testca.P256, testca.Validity(t0.Add(-24*time.Hour), t0.Add(10*365*24*time.Hour)))
}

// intermediates returns a Generate function minting year-long
// intermediates from root.
func intermediates(root *testca.CA) func(context.Context, time.Time) (*ca.Material, error) {
	return func(_ context.Context, now time.Time) (*ca.Material, error) {
		return keystore.GenerateIntermediate(root.Material(), keystore.GenerateOptions{TrustDomain: testTD, Lifetime: 365 * 24 * time.Hour}, now)
	}
}

// intermediate returns a new intermediate of root with status st and the
// timestamps it needs.
func intermediate(t testing.TB, root *testca.CA, st castate.Status) castate.Authority {
	t.Helper()
	m, err := intermediates(root)(context.Background(), t0)
	if err != nil {
		t.Fatal(err)
	}
	a := authority(t, st) // for the timestamps
	a.Cert, a.Key = m.Cert, m.Signer
	return a
}

func intermediateState(as ...castate.Authority) castate.State {
	return castate.State{Kind: castate.KindIntermediates, Authorities: as}
}

func TestValidateIntermediates(t *testing.T) {
	root, other := pluginRoot(t), pluginRoot(t)
	roots := []*x509.Certificate{root.Cert}
	tests := []struct {
		name  string
		state func(t *testing.T) castate.State
		roots []*x509.Certificate
		ok    bool
	}{
		{"one active", func(t *testing.T) castate.State {
			return intermediateState(intermediate(t, root, active))
		}, roots, true},
		{"mid rotation", func(t *testing.T) castate.State {
			return intermediateState(intermediate(t, root, retiring), intermediate(t, root, active), intermediate(t, root, prepared))
		}, roots, true},
		{"plug-in root being rolled: intermediates of both roots", func(t *testing.T) castate.State {
			return intermediateState(intermediate(t, root, retiring), intermediate(t, other, active))
		}, []*x509.Certificate{other.Cert, root.Cert}, true},
		{"wrong root", func(t *testing.T) castate.State {
			return intermediateState(intermediate(t, other, active))
		}, roots, false},
		{"retiring intermediate whose root left the bundle", func(t *testing.T) castate.State {
			return intermediateState(intermediate(t, root, retiring), intermediate(t, other, active))
		}, []*x509.Certificate{other.Cert}, false},
		{"key mismatch", func(t *testing.T) castate.State {
			s := intermediateState(intermediate(t, root, active), intermediate(t, root, prepared))
			return edit(s, 1, func(a *castate.Authority) { a.Key = s.Authorities[0].Key })
		}, roots, false},
		{"key of the root", func(t *testing.T) castate.State {
			return edit(intermediateState(intermediate(t, root, active)), 0, func(a *castate.Authority) { a.Key = root.Key })
		}, roots, false},
		{"self-signed root among intermediates", func(t *testing.T) castate.State {
			return intermediateState(intermediate(t, root, active), authority(t, prepared))
		}, roots, false},
		{"the plug-in root itself", func(t *testing.T) castate.State {
			return intermediateState(castate.Authority{Cert: root.Cert, Key: root.Key, Status: active, ActivatedAt: t0})
		}, roots, false},
		{"intermediates, but no roots given", func(t *testing.T) castate.State {
			return intermediateState(intermediate(t, root, active))
		}, nil, false},
		{"self-signed roots, but roots given", func(t *testing.T) castate.State { return stateOf(t, active) }, roots, false},
		{"intermediates in a state of roots", func(t *testing.T) castate.State {
			return castate.State{Authorities: []castate.Authority{intermediate(t, root, active)}}
		}, nil, false},
		{"unknown kind", func(t *testing.T) castate.State {
			s := intermediateState(intermediate(t, root, active))
			s.Kind = "subordinates"
			return s
		}, roots, false},
		{"an external root that is not a CA", func(t *testing.T) castate.State {
			return intermediateState(intermediate(t, root, active))
		}, []*x509.Certificate{testca.NewRoot(t, testca.P256, func(c *x509.Certificate) { c.IsCA = false }).Cert, root.Cert}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.state(t).ValidateUnder(tt.roots)
			t.Log(err)
			if tt.ok && err != nil {
				t.Fatalf("ValidateUnder = %v, want nil", err)
			}
			if !tt.ok && !errors.Is(err, castate.ErrInvalidState) {
				t.Fatalf("ValidateUnder = %v, want ErrInvalidState", err)
			}
		})
	}
}

func TestMaterialUnder(t *testing.T) {
	root, other := pluginRoot(t), pluginRoot(t)
	roots := []*x509.Certificate{root.Cert, other.Cert}
	s := intermediateState(intermediate(t, root, retiring), intermediate(t, root, active), intermediate(t, root, prepared))
	m, err := s.MaterialUnder(roots)
	if err != nil {
		t.Fatal(err)
	}
	if want := s.Authorities[1]; m.Cert != want.Cert || m.Signer != want.Key || len(m.Intermediates) != 0 || !sameCertList(m.Roots, roots) {
		t.Error("want the active intermediate signing, nothing between it and the roots, the external roots as bundle")
	}
	a, err := ca.New(ca.Config{TrustDomain: testTD, Clock: testingclock.NewFakePassiveClock(t0)}, m)
	if err != nil {
		t.Fatalf("ca.New: %v", err)
	}
	if above := a.Intermediates(); len(above) != 1 || !above[0].Equal(s.Authorities[1].Cert) {
		t.Error("chains must carry the active intermediate between leaf and roots")
	}
	if _, err := s.Material(); !errors.Is(err, castate.ErrInvalidState) {
		t.Errorf("Material of intermediates, without roots = %v, want ErrInvalidState", err)
	}
	if _, err := stateOf(t, active).MaterialUnder(roots); !errors.Is(err, castate.ErrInvalidState) {
		t.Errorf("MaterialUnder roots of self-signed roots = %v, want ErrInvalidState", err)
	}
}

func TestEncodeIntermediates(t *testing.T) {
	root := pluginRoot(t)
	s := intermediateState(intermediate(t, root, retiring), intermediate(t, root, active))
	data := mustEncode(t, s)
	if len(data) != 1 || !strings.Contains(string(data[castate.KeyState]), `"kind": "intermediates"`) {
		t.Errorf("Secret data keys %d, state %s; want only %s, with the kind", len(data), data[castate.KeyState], castate.KeyState)
	}
	got, err := castate.Decode(data)
	if err != nil || got.Kind != castate.KindIntermediates || !sameState(t, got, s) {
		t.Fatalf("round trip: %v, kind %q", err, got.Kind)
	}
	if err := got.ValidateUnder([]*x509.Certificate{root.Cert}); err != nil {
		t.Errorf("decoded state: %v", err)
	}
	if roots := mustEncode(t, stateOf(t, active)); strings.Contains(string(roots[castate.KeyState]), "kind") {
		t.Error("a state of self-signed roots must encode as before kinds existed")
	}
	bogus := strings.Replace(string(data[castate.KeyState]), `"intermediates"`, `"subordinates"`, 1)
	if _, err := castate.Decode(map[string][]byte{castate.KeyState: []byte(bogus)}); !errors.Is(err, castate.ErrInvalidState) {
		t.Errorf("Decode of an unknown kind = %v, want ErrInvalidState", err)
	}
}

func newIntermediateStore(t *testing.T, client *fake.Clientset, root *testca.CA, roots ...*x509.Certificate) *castate.SecretStore {
	t.Helper()
	s, err := castate.NewSecretStore(castate.SecretConfig{
		Client: client, Namespace: testNS, Name: testSecret, Generate: intermediates(root), Roots: roots,
		Clock: testingclock.NewFakePassiveClock(t0), Logger: testlog.New(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSecretStoreIntermediates(t *testing.T) {
	root, other := pluginRoot(t), pluginRoot(t)
	client := fake.NewClientset()
	st, err := newIntermediateStore(t, client, root, root.Cert).LoadOrCreate(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if a := st.Active(); st.Kind != castate.KindIntermediates || len(st.Authorities) != 1 || a.Cert.CheckSignatureFrom(root.Cert) != nil {
		t.Fatalf("created state of kind %q, %d authorities; want one intermediate issued by the plug-in root", st.Kind, len(st.Authorities))
	}
	sec := getSecret(t, client)
	if _, ok := sec.Data[castate.KeyRootCert]; ok || strings.Contains(string(sec.Data[castate.KeyState]), pemOf(root.Cert)) {
		t.Error("the plug-in root was written to the Secret")
	}
	loaded, err := newIntermediateStore(t, client, root, root.Cert).LoadOrCreate(t.Context())
	if err != nil || !sameState(t, loaded, st) {
		t.Fatalf("second store: %v; want the stored state", err)
	}

	refusers := map[string]*castate.SecretStore{
		"without roots":    newStore(t, client),
		"with other roots": newIntermediateStore(t, client, other, other.Cert),
	}
	for name, s := range refusers {
		if _, err := s.LoadOrCreate(t.Context()); !errors.Is(err, castate.ErrInvalidState) {
			t.Errorf("store %s: LoadOrCreate = %v, want ErrInvalidState", name, err)
		}
	}

	store := newIntermediateStore(t, client, root, root.Cert)
	foreign := intermediate(t, other, prepared)
	err = store.Update(t.Context(), func(s castate.State) (castate.State, error) {
		s.Authorities = append(s.Authorities, foreign)
		return s, nil
	})
	if !errors.Is(err, castate.ErrInvalidState) || string(getSecret(t, client).Data[castate.KeyState]) != string(sec.Data[castate.KeyState]) {
		t.Errorf("Update adding another root's intermediate = %v; want ErrInvalidState and nothing written", err)
	}
	ours := intermediate(t, root, prepared)
	err = store.Update(t.Context(), func(s castate.State) (castate.State, error) {
		s.Authorities = append(s.Authorities, ours)
		return s, nil
	})
	if got, _ := castate.Decode(getSecret(t, client).Data); err != nil || len(got.Authorities) != 2 || got.Kind != castate.KindIntermediates {
		t.Errorf("Update adding our intermediate = %v; want it stored", err)
	}
}

func TestSecretStoreRefusesSelfSignedUnderRoots(t *testing.T) {
	root := pluginRoot(t)
	client := fake.NewClientset()
	if _, err := newStore(t, client).LoadOrCreate(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := string(getSecret(t, client).Data[castate.KeyState])
	if _, err := newIntermediateStore(t, client, root, root.Cert).LoadOrCreate(t.Context()); !errors.Is(err, castate.ErrInvalidState) {
		t.Fatalf("LoadOrCreate under roots of a Secret of self-signed roots = %v, want ErrInvalidState", err)
	}
	if string(getSecret(t, client).Data[castate.KeyState]) != before {
		t.Error("the Secret was changed")
	}
}

func sameCertList(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

func pemOf(c *x509.Certificate) string {
	return strings.TrimSpace(string((&testca.CA{Cert: c}).CertPEM()))
}

// The plug-in root's bundle may change (its directory is reloaded): new
// roots that still hold the issuer of every intermediate in use are taken,
// and states are then validated under them; roots that drop it, or no
// roots at all, are refused and the old roots stay.
func TestSecretStoreSetRoots(t *testing.T) {
	root, next := pluginRoot(t), pluginRoot(t)
	client := fake.NewClientset()
	store := newIntermediateStore(t, client, root, root.Cert)
	if _, err := store.LoadOrCreate(t.Context()); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		roots []*x509.Certificate
		ok    bool
	}{
		{"the in-use root dropped", []*x509.Certificate{next.Cert}, false},
		{"no roots: a switch to self-signed roots", nil, false},
		{"a new root beside the in-use one", []*x509.Certificate{next.Cert, root.Cert}, true},
	}
	for _, tc := range tests {
		before := store.Roots()
		err := store.SetRoots(tc.roots)
		switch {
		case tc.ok && (err != nil || !sameCertList(store.Roots(), tc.roots)):
			t.Errorf("%s: SetRoots = %v, roots now %d; want them taken", tc.name, err, len(store.Roots()))
		case !tc.ok && (err == nil || !sameCertList(store.Roots(), before)):
			t.Errorf("%s: SetRoots = %v; want an error and the old roots kept", tc.name, err)
		}
	}
	// An intermediate of the new root is now valid in the Secret.
	err := store.Update(t.Context(), func(s castate.State) (castate.State, error) {
		s.Authorities = append(s.Authorities, intermediate(t, next, prepared))
		return s, nil
	})
	if err != nil {
		t.Errorf("Update adding an intermediate of the new root: %v", err)
	}
}
