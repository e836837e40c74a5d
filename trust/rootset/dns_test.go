package rootset

import (
	"crypto/x509"
	"errors"
	"testing"

	"github.com/workload-ca/workload-ca/internal/testca"
)

// TestKeepsOffDNS: a federated root in Istio's
// root ConfigMap also vouches for DNS names, so it may go there only when
// its name constraints keep it off ours. A URI constraint alone leaves
// DNS open.
func TestKeepsOffDNS(t *testing.T) {
	ours := []string{"svc", "cluster.local", "istiod.istio-system.svc", "mesh.example"}
	root := func(f func(*x509.Certificate)) *x509.Certificate { return testca.NewRoot(t, testca.P256, f).Cert }
	tests := []struct {
		name string
		cert *x509.Certificate
		ok   bool
	}{
		{"no name constraints", root(func(*x509.Certificate) {}), false},
		{"a URI constraint only: DNS open", root(func(c *x509.Certificate) {
			c.PermittedURIDomains = []string{"peer.example"}
		}), false},
		{"permits only a DNS domain of its own", root(func(c *x509.Certificate) {
			c.PermittedDNSDomains = []string{"peer.example", ".peer.example"}
		}), true},
		{"every DNS name excluded", root(func(c *x509.Certificate) {
			c.PermittedURIDomains, c.ExcludedDNSDomains = []string{"peer.example"}, []string{""}
		}), true},
		{"each of our domains excluded", root(func(c *x509.Certificate) {
			c.ExcludedDNSDomains = []string{"svc", "local", "mesh.example"}
		}), true},
		{"one of our domains not excluded", root(func(c *x509.Certificate) {
			c.ExcludedDNSDomains = []string{"svc", "cluster.local"}
		}), false},
		{"permits svc", root(func(c *x509.Certificate) {
			c.PermittedDNSDomains = []string{"peer.example", "svc"}
		}), false},
		{"permits a namespace's services", root(func(c *x509.Certificate) {
			c.PermittedDNSDomains = []string{"istio-system.svc"}
		}), false},
		{"permits a parent of the cluster domain", root(func(c *x509.Certificate) {
			c.PermittedDNSDomains = []string{".local"}
		}), false},
		{"permits a name under our trust domain", root(func(c *x509.Certificate) {
			c.PermittedDNSDomains = []string{"api.MESH.example"}
		}), false},
		{"permits a domain that only ends like ours", root(func(c *x509.Certificate) {
			c.PermittedDNSDomains = []string{"notsvc", "othermesh.example"}
		}), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := KeepsOffDNS(tc.cert, ours)
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrDNSUnconstrained)) {
				t.Fatalf("KeepsOffDNS = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// TestKeepsOffDNSMatchesVerify checks the rule against crypto/x509: a
// root the rule accepts does not verify a leaf for istiod's name, and one
// it refuses does.
func TestKeepsOffDNSMatchesVerify(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(*x509.Certificate)
	}{
		{"permits its own domain", func(c *x509.Certificate) { c.PermittedDNSDomains = []string{"peer.example"} }},
		{"excludes every DNS name", func(c *x509.Certificate) { c.ExcludedDNSDomains = []string{""} }},
		{"URI constraint only", func(c *x509.Certificate) { c.PermittedURIDomains = []string{"peer.example"} }},
		{"permits svc", func(c *x509.Certificate) { c.PermittedDNSDomains = []string{"svc"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer := testca.NewRoot(t, testca.P256, tc.f)
			leaf := testca.Sign(t, &x509.Certificate{SerialNumber: peer.Cert.SerialNumber, NotBefore: peer.Cert.NotBefore,
				NotAfter: peer.Cert.NotAfter, DNSNames: []string{"istiod.istio-system.svc"}},
				peer.Cert, testca.NewKey(t, testca.P256).Public(), peer.Key)
			pool := x509.NewCertPool()
			pool.AddCert(peer.Cert)
			_, verr := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "istiod.istio-system.svc"})
			kerr := KeepsOffDNS(peer.Cert, []string{"svc"})
			if (kerr == nil) != (verr != nil) {
				t.Fatalf("KeepsOffDNS = %v but Verify for istiod.istio-system.svc = %v", kerr, verr)
			}
		})
	}
}
