package ca_test

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestValidateAccepts(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	for name, m := range map[string]*ca.Material{
		"root":                        root.Material(),
		"RSA root":                    testca.NewRoot(t, testca.RSA2048).Material(),
		"intermediate":                testca.NewIntermediate(t, root, testca.P256).Material(),
		"intermediate, two levels":    testca.NewIntermediate(t, testca.NewIntermediate(t, root, testca.P256), testca.P256).Material(),
		"root with another in bundle": root.Material(testca.NewRoot(t, testca.P384).Cert),
	} {
		if err := m.Validate(time.Now()); err != nil {
			t.Errorf("%s: Validate: %v", name, err)
		}
	}
}

func TestValidateRejects(t *testing.T) {
	now := time.Now()
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P256)
	leaf := nonCA(t, root)
	tests := []struct {
		name    string
		m       *ca.Material
		wantMsg string
	}{
		{"nil material", nil, "no material"},
		{"no signer", &ca.Material{Cert: root.Cert, Roots: []*x509.Certificate{root.Cert}}, "no signing key"},
		{"no cert", &ca.Material{Signer: root.Key, Roots: []*x509.Certificate{root.Cert}}, "no signing certificate"},
		{"no roots", &ca.Material{Signer: root.Key, Cert: root.Cert}, "empty root bundle"},
		{"nil intermediate", &ca.Material{Signer: mid.Key, Cert: mid.Cert, Intermediates: []*x509.Certificate{nil}, Roots: []*x509.Certificate{root.Cert}}, "nil intermediate"},
		{"key mismatch", &ca.Material{Signer: testca.NewKey(t, testca.P256), Cert: root.Cert, Roots: []*x509.Certificate{root.Cert}}, "does not match"},
		{"non-CA signing cert", &ca.Material{Signer: leaf.Key, Cert: leaf.Cert, Roots: []*x509.Certificate{root.Cert}}, "not a CA"},
		{"CA without certSign", noCertSign(t, root), "lacks certSign"},
		{"non-CA in the root bundle", &ca.Material{Signer: root.Key, Cert: root.Cert, Roots: []*x509.Certificate{root.Cert, leaf.Cert}}, "root 1"},
		{"chain to another root", edit(mid.Material(), func(m *ca.Material) { m.Roots = []*x509.Certificate{testca.NewRoot(t, testca.P256).Cert} }), "does not chain"},
		{"missing intermediate", edit(testca.NewIntermediate(t, mid, testca.P256).Material(), func(m *ca.Material) { m.Intermediates = nil }), "does not chain"},
		{"intermediates out of order", outOfOrder(t, mid), "chain order"},
		{"unrelated intermediate", edit(mid.Material(), func(m *ca.Material) {
			m.Intermediates = []*x509.Certificate{testca.NewRoot(t, testca.P256).Cert}
		}), "chain order"},
		{"expired", testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-48*time.Hour), now.Add(-time.Hour))).Material(), "expired"},
		{"not yet valid", testca.NewRoot(t, testca.P256, testca.Validity(now.Add(time.Hour), now.Add(48*time.Hour))).Material(), "not valid before"},
		{"expired root above a valid intermediate", expiredRootChain(t, now), "does not chain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.m.Validate(now)
			if !errors.Is(err, ca.ErrInvalidMaterial) {
				t.Fatalf("Validate = %v, want ErrInvalidMaterial", err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not mention %q", err, tt.wantMsg)
			}
		})
	}
}

// nonCA returns an end-entity certificate signed by parent, with its key.
func nonCA(t *testing.T, parent *testca.CA) *testca.CA {
	key := testca.NewKey(t, testca.P256)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "not a CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
	}
	return &testca.CA{Key: key, Cert: testca.Sign(t, tmpl, parent.Cert, key.Public(), parent.Key), Parent: parent}
}

func noCertSign(t *testing.T, root *testca.CA) *ca.Material {
	c := testca.NewIntermediate(t, root, testca.P256, func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature })
	return c.Material()
}

func expiredRootChain(t *testing.T, now time.Time) *ca.Material {
	root := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-48*time.Hour), now.Add(-time.Hour)))
	return testca.NewIntermediate(t, root, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(time.Hour))).Material()
}

// outOfOrder is a CA two intermediates below root with its intermediates
// listed root-side first.
func outOfOrder(t *testing.T, mid *testca.CA) *ca.Material {
	mid2 := testca.NewIntermediate(t, mid, testca.P256)
	m := testca.NewIntermediate(t, mid2, testca.P256).Material()
	m.Intermediates[0], m.Intermediates[1] = m.Intermediates[1], m.Intermediates[0]
	return m
}

func edit(m *ca.Material, f func(*ca.Material)) *ca.Material {
	f(m)
	return m
}

func spiffeURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
