package castate_test

import (
	"context"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testlog"
)

// upstreamMaterial is what an upstream answers: an intermediate that
// issuer (a root, or an intermediate under one) signed, with the chain
// above it up to the root.
func upstreamMaterial(t testing.TB, issuer *testca.CA) *ca.Material {
	t.Helper()
	m, err := keystore.GenerateIntermediate(&ca.Material{Signer: issuer.Key, Cert: issuer.Cert, Roots: []*x509.Certificate{issuer.Cert}},
		keystore.GenerateOptions{TrustDomain: testTD, Lifetime: 365 * 24 * time.Hour}, t0)
	if err != nil {
		t.Fatal(err)
	}
	m.Roots = []*x509.Certificate{issuer.Root().Cert}
	if issuer.Parent != nil {
		m.Intermediates = append([]*x509.Certificate{issuer.Cert}, issuer.Material().Intermediates...)
	}
	return m
}

// upstreamAuthority is an upstream intermediate of issuer with status st.
func upstreamAuthority(t testing.TB, issuer *testca.CA, st castate.Status) castate.Authority {
	t.Helper()
	m := upstreamMaterial(t, issuer)
	a := authority(t, st)
	a.Cert, a.Key, a.Chain = m.Cert, m.Signer, castate.UpstreamChain(castate.KindUpstream, m)
	if st == castate.StatusRetiring {
		a.Key = nil
	}
	return a
}

func upstreamState(as ...castate.Authority) castate.State {
	return castate.State{Kind: castate.KindUpstream, Authorities: as}
}

func TestValidateUpstream(t *testing.T) {
	root, next := pluginRoot(t), pluginRoot(t)
	vault := testca.NewIntermediate(t, root, testca.P256, testca.Validity(t0.Add(-time.Hour), t0.Add(5*365*24*time.Hour)))
	tests := []struct {
		name  string
		state func(t *testing.T) castate.State
		ok    bool
	}{
		{"one active, issued by the upstream root", func(t *testing.T) castate.State {
			return upstreamState(upstreamAuthority(t, root, active))
		}, true},
		{"issued by an upstream intermediate", func(t *testing.T) castate.State {
			return upstreamState(upstreamAuthority(t, vault, active))
		}, true},
		{"the upstream moved to a new root mid rotation", func(t *testing.T) castate.State {
			return upstreamState(upstreamAuthority(t, root, retiring), upstreamAuthority(t, root, active), upstreamAuthority(t, next, prepared))
		}, true},
		{"no chain", func(t *testing.T) castate.State {
			return edit(upstreamState(upstreamAuthority(t, root, active)), 0, func(a *castate.Authority) { a.Chain = nil })
		}, false},
		{"a chain that did not issue it", func(t *testing.T) castate.State {
			return edit(upstreamState(upstreamAuthority(t, root, active)), 0, func(a *castate.Authority) { a.Chain = []*x509.Certificate{next.Cert} })
		}, false},
		{"chain out of order", func(t *testing.T) castate.State {
			return edit(upstreamState(upstreamAuthority(t, vault, active)), 0, func(a *castate.Authority) {
				a.Chain = []*x509.Certificate{root.Cert, vault.Cert}
			})
		}, false},
		{"a plug-in root's intermediate with a chain", func(t *testing.T) castate.State {
			s := upstreamState(upstreamAuthority(t, root, active))
			s.Kind = castate.KindIntermediates
			return s
		}, false},
		{"a self-signed root", func(t *testing.T) castate.State {
			a := authority(t, active)
			a.Chain = []*x509.Certificate{a.Cert}
			return upstreamState(a)
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.state(t).Validate()
			if tt.ok != (err == nil) {
				t.Fatalf("Validate() = %v, want ok %v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, castate.ErrInvalidState) {
				t.Fatalf("error %v does not wrap ErrInvalidState", err)
			}
		})
	}
}

// The state of upstream intermediates is its own bundle: the anchors of
// every authority, and the active one's chain below its anchor.
func TestMaterialUpstream(t *testing.T) {
	root, next := pluginRoot(t), pluginRoot(t)
	vault := testca.NewIntermediate(t, root, testca.P256, testca.Validity(t0.Add(-time.Hour), t0.Add(5*365*24*time.Hour)))
	old, cur, prep := upstreamAuthority(t, root, retiring), upstreamAuthority(t, vault, active), upstreamAuthority(t, next, prepared)
	s := upstreamState(old, cur, prep)
	m, err := s.Material()
	if err != nil {
		t.Fatal(err)
	}
	if !m.Cert.Equal(cur.Cert) || len(m.Intermediates) != 1 || !m.Intermediates[0].Equal(vault.Cert) {
		t.Fatalf("signing %v with intermediates %v; want the active intermediate and the upstream's", m.Cert.Subject, m.Intermediates)
	}
	if len(m.Roots) != 2 || !m.Roots[0].Equal(root.Cert) || !m.Roots[1].Equal(next.Cert) {
		t.Fatalf("bundle of %d roots, want the two upstream roots once each, oldest first", len(m.Roots))
	}
	if err := m.Validate(t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MaterialUnder([]*x509.Certificate{root.Cert}); err == nil {
		t.Fatal("MaterialUnder external roots accepted a state of upstream intermediates")
	}

	data := mustEncode(t, s)
	for _, k := range []string{castate.KeyRootCert, castate.KeyCACert} {
		if got := string(data[k]); got != pemOf(root.Cert)+"\n"+pemOf(next.Cert)+"\n" {
			t.Errorf("%s holds %q, want the two anchors", k, got)
		}
	}
	back, err := castate.Decode(data)
	if err != nil || !sameState(t, back, s) || len(back.Authorities[1].Chain) != 2 {
		t.Fatalf("round trip: %v", err)
	}
}

func TestSecretStoreUpstream(t *testing.T) {
	root := pluginRoot(t)
	client := fake.NewClientset()
	gen := func(context.Context, time.Time) (*ca.Material, error) { return upstreamMaterial(t, root), nil }
	store, err := castate.NewSecretStore(castate.SecretConfig{Client: client, Namespace: testNS, Name: testSecret, Generate: gen,
		Upstream: true, Clock: testingclock.NewFakePassiveClock(t0), Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.LoadOrCreate(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Kind != castate.KindUpstream || len(st.Active().Chain) != 1 || !st.Active().Chain[0].Equal(root.Cert) {
		t.Fatalf("created state of kind %q with chain %v; want an upstream intermediate and its root", st.Kind, st.Active().Chain)
	}
	if !strings.Contains(string(getSecret(t, client).Data[castate.KeyCACert]), pemOf(root.Cert)) {
		t.Error("ca.crt lacks the upstream root")
	}
	if _, err := newIntermediateStore(t, client, root, root.Cert).LoadOrCreate(t.Context()); !errors.Is(err, castate.ErrInvalidState) {
		t.Errorf("a store of plug-in root intermediates read the upstream state: %v", err)
	}
	if _, err := castate.NewSecretStore(castate.SecretConfig{Client: client, Namespace: testNS, Name: testSecret,
		Upstream: true, Roots: []*x509.Certificate{root.Cert}}); err == nil {
		t.Error("NewSecretStore took external roots for upstream intermediates")
	}
}
