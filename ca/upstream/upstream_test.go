package upstream_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/ca/upstream"
	"github.com/workload-ca/workload-ca/internal/testca"
)

var td = spiffeid.RequireTrustDomainFromString("example.org")

// fakeUpstream signs CSRs with issuer, as an upstream CA would, after
// edit has changed the template; err, if set, is its only answer.
type fakeUpstream struct {
	t      *testing.T
	issuer *testca.CA
	edit   func(*x509.Certificate)
	err    error

	mu   sync.Mutex
	reqs []upstream.Request
}

func (f *fakeUpstream) SignIntermediate(_ context.Context, req upstream.Request) (upstream.Issued, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	if f.err != nil {
		return upstream.Issued{}, f.err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), Subject: req.CSR.Subject, URIs: req.CSR.URIs,
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(req.TTL),
		BasicConstraintsValid: true, IsCA: true, MaxPathLen: 0, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	if f.edit != nil {
		f.edit(tmpl)
	}
	cert := testca.Sign(f.t, tmpl, f.issuer.Cert, req.CSR.PublicKey, f.issuer.Key)
	var chain []*x509.Certificate
	for c := f.issuer; c != nil; c = c.Parent {
		chain = append(chain, c.Cert)
	}
	return upstream.Issued{Cert: cert, Chain: chain}, nil
}

func newMinter(t *testing.T, up upstream.Authority, obs upstream.Observer) *upstream.Minter {
	t.Helper()
	m, err := upstream.New(upstream.Config{Authority: up, TrustDomain: td, Lifetime: 30 * 24 * time.Hour, NameConstraints: true, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type observed struct {
	mu   sync.Mutex
	errs []error
}

func (o *observed) UpstreamRequest(err error, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs = append(o.errs, err)
}

func TestGenerate(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	company := testca.NewIntermediate(t, root, testca.P256) // a Vault mount under the company's offline root
	tests := []struct {
		name      string
		issuer    *testca.CA
		edit      func(*x509.Certificate)
		wantErr   string
		wantChain int
		// anyPathLen: Config.AnyPathLength.
		anyPathLen bool
	}{
		{name: "issued by the upstream root", issuer: root},
		{name: "issued by an upstream intermediate", issuer: company, wantChain: 1},
		{name: "path length unlimited is refused", issuer: root, edit: func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = -1, false },
			wantErr: "path length unlimited"},
		{name: "path length 1 is refused", issuer: root, edit: func(c *x509.Certificate) { c.MaxPathLen = 1 }, wantErr: "path length 1"},
		{name: "path length unlimited is taken where the upstream cannot be asked", issuer: root, anyPathLen: true,
			edit: func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = -1, false }},
		{name: "not a CA is refused", issuer: root, edit: func(c *x509.Certificate) { c.IsCA, c.MaxPathLenZero = false, false }, wantErr: "not a CA"},
		{name: "no certSign is refused", issuer: root, edit: func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageCRLSign }, wantErr: "certSign"},
		{name: "expired is refused", issuer: root, edit: func(c *x509.Certificate) {
			c.NotBefore, c.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
		}, wantErr: "expired"},
		{name: "another trust domain is refused", issuer: root, edit: func(c *x509.Certificate) {
			c.URIs = []*url.URL{spiffeid.RequireTrustDomainFromString("other.org").ID().URL()}
		}, wantErr: "trust domain"},
		{name: "a name constraint excluding the trust domain is refused", issuer: root, edit: func(c *x509.Certificate) {
			c.PermittedURIDomains = []string{"other.org"}
		}, wantErr: "would not verify"},
		{name: "a name constraint of the trust domain is accepted", issuer: root, edit: func(c *x509.Certificate) {
			c.PermittedURIDomains = []string{td.Name()}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := &fakeUpstream{t: t, issuer: tt.issuer, edit: tt.edit}
			obs := &observed{}
			minter, err := upstream.New(upstream.Config{Authority: up, TrustDomain: td, Lifetime: 30 * 24 * time.Hour,
				AnyPathLength: tt.anyPathLen, Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			m, err := minter.Generate(t.Context(), time.Now())
			if len(obs.errs) != 1 {
				t.Fatalf("observer told %d outcomes, want 1", len(obs.errs))
			}
			if tt.wantErr != "" {
				if err == nil || !errors.Is(err, upstream.ErrUpstream) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Generate error = %v, want ErrUpstream containing %q", err, tt.wantErr)
				}
				if obs.errs[0] == nil {
					t.Fatal("observer told success for a refused answer")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Intermediates) != tt.wantChain || !m.Roots[0].Equal(root.Cert) || len(m.Roots) != 1 {
				t.Fatalf("material has %d intermediates and roots %v, want %d and the upstream root", len(m.Intermediates), m.Roots, tt.wantChain)
			}
			if err := m.Validate(time.Now()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestGenerateRequest: the CSR names the CA's trust domain, and asks for
// a CA of path length 0 that signs certificates, with a key of its own
// each time.
func TestGenerateRequest(t *testing.T) {
	up := &fakeUpstream{t: t, issuer: testca.NewRoot(t, testca.P256)}
	minter := newMinter(t, up, nil)
	var keys []crypto.PublicKey
	for range 2 {
		if _, err := minter.Generate(t.Context(), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	for _, req := range up.reqs {
		csr := req.CSR
		if err := csr.CheckSignature(); err != nil {
			t.Fatal(err)
		}
		if len(csr.URIs) != 1 || csr.URIs[0].String() != "spiffe://example.org" || csr.Subject.CommonName != keystore.IntermediateCommonName {
			t.Fatalf("CSR names %v, %q", csr.URIs, csr.Subject.CommonName)
		}
		exts := map[string]bool{}
		for _, e := range csr.Extensions {
			exts[e.Id.String()] = e.Critical
		}
		if !exts["2.5.29.19"] || !exts["2.5.29.15"] {
			t.Fatalf("CSR lacks critical basic constraints and key usage: %v", exts)
		}
		if req.TTL != 30*24*time.Hour || !req.NameConstraints || req.TrustDomain != td {
			t.Fatalf("request %+v", req)
		}
		keys = append(keys, csr.PublicKey)
	}
	if keys[0].(interface{ Equal(crypto.PublicKey) bool }).Equal(keys[1]) {
		t.Fatal("two intermediates asked for with the same key")
	}
}

func TestGenerateUpstreamError(t *testing.T) {
	boom := errors.New("connection refused")
	obs := &observed{}
	_, err := newMinter(t, &fakeUpstream{t: t, err: boom}, obs).Generate(t.Context(), time.Now())
	if !errors.Is(err, boom) || len(obs.errs) != 1 || !errors.Is(obs.errs[0], boom) {
		t.Fatalf("Generate error = %v, observed %v; want the upstream's error", err, obs.errs)
	}
}

func TestCheckChainOrder(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P256)
	key := testca.NewKey(t, testca.P256)
	now := time.Now()
	cert := testca.Sign(t, &x509.Certificate{SerialNumber: big.NewInt(7), URIs: []*url.URL{td.ID().URL()},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), BasicConstraintsValid: true, IsCA: true,
		MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign}, mid.Cert, key.Public(), mid.Key)
	tests := []struct {
		name    string
		issued  upstream.Issued
		key     crypto.Signer
		wantErr string
	}{
		{"in order", upstream.Issued{Cert: cert, Chain: []*x509.Certificate{mid.Cert, root.Cert}}, key, ""},
		{"anchor is the upstream intermediate", upstream.Issued{Cert: cert, Chain: []*x509.Certificate{mid.Cert}}, key, ""},
		{"reversed", upstream.Issued{Cert: cert, Chain: []*x509.Certificate{root.Cert, mid.Cert}}, key, "in order"},
		{"no chain", upstream.Issued{Cert: cert}, key, "no chain"},
		{"another key", upstream.Issued{Cert: cert, Chain: []*x509.Certificate{mid.Cert, root.Cert}}, testca.NewKey(t, testca.P256), "not for the key"},
		{"no certificate", upstream.Issued{}, key, "no certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := upstream.Check(tt.issued, tt.key, upstream.CheckOptions{TrustDomain: td, Now: now})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !m.Roots[0].Equal(tt.issued.Chain[len(tt.issued.Chain)-1]) {
					t.Fatal("the anchor is not the chain's last certificate")
				}
				return
			}
			if !errors.Is(err, upstream.ErrUpstream) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Check error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}
