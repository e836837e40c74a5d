package ca_test

import (
	"context"
	"crypto/x509"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestSignChainOrder(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	otherRoot := testca.NewRoot(t, testca.RSA2048)
	mid := testca.NewIntermediate(t, root, testca.P384)
	signing := testca.NewIntermediate(t, mid, testca.P256)
	tests := []struct {
		name      string
		material  *ca.Material
		wantChain [][]*x509.Certificate // after the leaf
	}{
		{"self-signed root", root.Material(), [][]*x509.Certificate{{root.Cert}}},
		{"intermediate under a second intermediate", signing.Material(),
			[][]*x509.Certificate{{signing.Cert}, {mid.Cert}, {root.Cert}}},
		{"multi-root bundle is one last element", root.Material(otherRoot.Cert),
			[][]*x509.Certificate{{root.Cert, otherRoot.Cert}}},
		{"signing root second in the bundle", &ca.Material{Signer: root.Key, Cert: root.Cert, Roots: []*x509.Certificate{otherRoot.Cert, root.Cert}},
			[][]*x509.Certificate{{otherRoot.Cert, root.Cert}}},
		{"intermediate with a multi-root bundle", signing.Material(otherRoot.Cert),
			[][]*x509.Certificate{{signing.Cert}, {mid.Cert}, {root.Cert, otherRoot.Cert}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := testNow()
			issued := signZtunnel(t, newAuthority(t, tt.material, now), 0)
			got := parseChain(t, issued.Chain)
			if len(got[0]) != 1 || !got[0][0].Equal(issued.Cert) {
				t.Fatalf("chain[0] is not the issued leaf alone")
			}
			if diff := cmp.Diff(subjects(tt.wantChain), subjects(got[1:])); diff != "" {
				t.Errorf("chain after the leaf (-want +got):\n%s", diff)
			}
			if id := verifySVID(t, issued.Chain, now); id != workload {
				t.Errorf("verified ID = %s, want %s", id, workload)
			}
		})
	}
}

func subjects(chain [][]*x509.Certificate) [][]string {
	out := make([][]string, len(chain))
	for i, el := range chain {
		for _, c := range el {
			out[i] = append(out[i], c.Subject.CommonName)
		}
	}
	return out
}

func TestIssueServing(t *testing.T) {
	now := testNow()
	root := testca.NewRoot(t, testca.P256)
	signing := testca.NewIntermediate(t, root, testca.P256)
	a := newAuthority(t, signing.Material(), now)
	key := testca.NewKey(t, testca.P256)
	names := []string{"workload-ca.workload-ca.svc", "workload-ca.workload-ca.svc.cluster.local"}

	leaf, above, err := a.IssueServing(context.Background(), key.Public(), names, 0)
	if err != nil {
		t.Fatalf("IssueServing: %v", err)
	}
	if diff := cmp.Diff(names, leaf.DNSNames); diff != "" {
		t.Errorf("DNSNames (-want +got):\n%s", diff)
	}
	if len(leaf.URIs) != 0 || leaf.IsCA || !sanExtensionCritical(leaf) {
		t.Errorf("URIs=%v IsCA=%v SAN critical=%v; want no URI, not a CA, critical SAN", leaf.URIs, leaf.IsCA, sanExtensionCritical(leaf))
	}
	if diff := cmp.Diff([]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, leaf.ExtKeyUsage); diff != "" {
		t.Errorf("ExtKeyUsage (-want +got):\n%s", diff)
	}
	if len(above) != 1 || !above[0].Equal(signing.Cert) {
		t.Fatalf("chain above the leaf = %d certs, want [signing intermediate]", len(above))
	}
	opts := x509.VerifyOptions{DNSName: names[0], Roots: x509.NewCertPool(), Intermediates: x509.NewCertPool(), CurrentTime: now}
	opts.Roots.AddCert(root.Cert)
	opts.Intermediates.AddCert(above[0])
	if _, err := leaf.Verify(opts); err != nil {
		t.Errorf("serving certificate does not verify as a TLS server certificate: %v", err)
	}
	if _, _, err := a.IssueServing(context.Background(), key.Public(), nil, 0); err == nil {
		t.Error("IssueServing without DNS names succeeded")
	}
}

func TestIssueServingSVID(t *testing.T) {
	now := testNow()
	root := testca.NewRoot(t, testca.P256)
	a := newAuthority(t, root.Material(), now)
	key := testca.NewKey(t, testca.P256)
	id := spiffeid.RequireFromString("spiffe://cluster.local/workload-ca/bundle-endpoint")

	leaf, _, err := a.IssueServingSVID(context.Background(), key.Public(), id, 0)
	if err != nil {
		t.Fatalf("IssueServingSVID: %v", err)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() || len(leaf.DNSNames) != 0 || leaf.IsCA {
		t.Errorf("URIs=%v DNSNames=%v IsCA=%v; want only %s, not a CA", leaf.URIs, leaf.DNSNames, leaf.IsCA, id)
	}
	opts := x509.VerifyOptions{Roots: x509.NewCertPool(), CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	opts.Roots.AddCert(root.Cert)
	if _, err := leaf.Verify(opts); err != nil {
		t.Errorf("SVID does not verify as a TLS server certificate: %v", err)
	}
	foreign := spiffeid.RequireFromString("spiffe://other.example/workload-ca")
	if _, _, err := a.IssueServingSVID(context.Background(), key.Public(), foreign, 0); !errors.Is(err, ca.ErrForeignTrustDomain) {
		t.Errorf("SVID of another trust domain: %v, want ErrForeignTrustDomain", err)
	}
}

// TestIssueServingRefusesNamesAConstraintForbids issues serving
// certificates under a CA whose DNS name constraints a TLS client would
// apply to them: refused with the reason, not served to clients that
// reject it. The SPIFFE leaves of the same chain are not concerned.
func TestIssueServingRefusesNamesAConstraintForbids(t *testing.T) {
	now := testNow()
	names := []string{"workload-ca.workload-ca.svc"}
	tests := []struct {
		name  string
		above testca.Option // of the CA that issued the signing certificate
		want  bool          // issued
	}{
		{name: "no constraints", above: func(*x509.Certificate) {}, want: true},
		{name: "DNS names permitted in another domain", above: func(c *x509.Certificate) {
			c.PermittedDNSDomains = []string{"corp.example"}
		}},
		{name: "DNS names permitted in ours", above: func(c *x509.Certificate) {
			c.PermittedDNSDomains = []string{"svc"}
		}, want: true},
		{name: "our DNS names excluded", above: func(c *x509.Certificate) {
			c.ExcludedDNSDomains = []string{"workload-ca.svc"}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := testca.NewRoot(t, testca.P256)
			enterprise := testca.NewIntermediate(t, root, testca.P256, tt.above)
			signing := testca.NewIntermediate(t, enterprise, testca.P256)
			a := newAuthority(t, signing.Material(), now)
			key := testca.NewKey(t, testca.P256)
			_, _, err := a.IssueServing(context.Background(), key.Public(), names, 0)
			switch {
			case tt.want && err != nil:
				t.Fatalf("IssueServing: %v", err)
			case !tt.want && (err == nil || !strings.Contains(err.Error(), "constraint")):
				t.Fatalf("IssueServing = %v, want an error naming the constraint", err)
			}
			verifySVID(t, signZtunnel(t, a, time.Hour).Chain, now)
		})
	}
}

func TestSetMaterial(t *testing.T) {
	now := testNow()
	first := testca.NewRoot(t, testca.P256)
	a := newAuthority(t, first.Material(), now)

	bad := testca.NewRoot(t, testca.P256).Material()
	bad.Signer = testca.NewKey(t, testca.P256)
	if err := a.SetMaterial(bad); !errors.Is(err, ca.ErrInvalidMaterial) {
		t.Fatalf("SetMaterial(bad) = %v, want ErrInvalidMaterial", err)
	}
	if !a.SigningCert().Equal(first.Cert) {
		t.Fatal("a refused material replaced the serving one")
	}

	second := testca.NewRoot(t, testca.P256)
	if err := a.SetMaterial(second.Material(first.Cert)); err != nil {
		t.Fatalf("SetMaterial(good): %v", err)
	}
	if !a.SigningCert().Equal(second.Cert) || len(a.Roots()) != 2 {
		t.Fatal("SetMaterial did not switch to the new material")
	}
	if id := verifySVID(t, signZtunnel(t, a, 0).Chain, now); id != workload {
		t.Errorf("verified ID = %s, want %s", id, workload)
	}
}

func TestSignConcurrentWithSetMaterial(t *testing.T) {
	now := testNow()
	cas := []*testca.CA{testca.NewRoot(t, testca.P256), testca.NewRoot(t, testca.P256)}
	a := newAuthority(t, cas[0].Material(), now)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 10 {
				if i == 0 {
					if err := a.SetMaterial(cas[j%2].Material()); err != nil {
						t.Error(err)
					}
					continue
				}
				verifySVID(t, signZtunnel(t, a, 0).Chain, now)
			}
		})
	}
	wg.Wait()
}

func TestNewRefusesForeignTrustDomainCA(t *testing.T) {
	root := testca.NewRoot(t, testca.P256, func(c *x509.Certificate) {
		c.URIs = append(c.URIs, spiffeURL(t, "spiffe://other.example"))
	})
	if _, err := ca.New(ca.Config{TrustDomain: td}, root.Material()); !errors.Is(err, ca.ErrInvalidMaterial) {
		t.Fatalf("New = %v, want ErrInvalidMaterial", err)
	}
}

// TestNewRefusesChainsThatForbidItsLeaves loads material whose signing
// certificate chains to the root, but whose CAs above it forbid the leaves
// it would issue: refused at load, with the reason, rather than issuing
// SVIDs no peer accepts. The key is never used for the check.
func TestNewRefusesChainsThatForbidItsLeaves(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	pathLenZero := func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = 0, true }
	tests := []struct {
		name    string
		above   testca.Option // of the CA that issued the signing certificate
		wantMsg string        // "": accepted
	}{
		{name: "no constraints", above: func(*x509.Certificate) {}},
		{name: "path length 0 above the signing CA", above: pathLenZero, wantMsg: "path length"},
		{name: "name constraints for another trust domain", above: func(c *x509.Certificate) {
			c.PermittedURIDomains = []string{"example.org"}
		}, wantMsg: "constraint"},
		{name: "name constraints for ours", above: func(c *x509.Certificate) {
			c.PermittedURIDomains = []string{"cluster.local"}
		}},
		{name: "server authentication only", above: func(c *x509.Certificate) {
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		}, wantMsg: "key usage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := testca.NewRoot(t, testca.P256)
			enterprise := testca.NewIntermediate(t, root, testca.P256, tt.above)
			signing := testca.NewIntermediate(t, enterprise, testca.P256)
			m := signing.Material()
			m.Signer = brokenSigner{m.Signer} // the check never signs with the CA key
			if err := m.Validate(time.Now()); err != nil {
				t.Fatalf("Validate: %v (the signing certificate itself chains)", err)
			}
			_, err := ca.New(ca.Config{TrustDomain: td}, m)
			switch {
			case tt.wantMsg == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.wantMsg != "" && (!errors.Is(err, ca.ErrInvalidMaterial) || !strings.Contains(err.Error(), tt.wantMsg)):
				t.Fatalf("New: %v, want ErrInvalidMaterial mentioning %q", err, tt.wantMsg)
			}
		})
	}
}
