package ca_test

import (
	"context"
	"crypto/x509"
	"errors"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

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
