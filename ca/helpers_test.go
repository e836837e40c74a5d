package ca_test

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"go.step.sm/crypto/pemutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
)

var (
	td       = spiffeid.RequireTrustDomainFromString("cluster.local")
	workload = spiffeid.RequireFromPath(td, "/ns/demo/sa/default")
)

// testNow is a whole second so that times survive X.509 encoding unchanged.
func testNow() time.Time { return time.Now().UTC().Truncate(time.Second) }

func newAuthority(t testing.TB, m *ca.Material, now time.Time) *ca.Authority {
	t.Helper()
	a, err := ca.New(ca.Config{TrustDomain: td, Clock: testingclock.NewFakePassiveClock(now)}, m)
	if err != nil {
		t.Fatalf("ca.New: %v", err)
	}
	return a
}

func parseCSR(t testing.TB, pemBytes []byte) *x509.CertificateRequest {
	t.Helper()
	csr, err := ca.ParseCSR(pemBytes)
	if err != nil {
		t.Fatalf("ParseCSR: %v", err)
	}
	return csr
}

// signZtunnel issues a certificate for workload to a ztunnel-shaped CSR.
func signZtunnel(t testing.TB, a *ca.Authority, ttl time.Duration) *ca.Issued {
	t.Helper()
	csrPEM, _ := testca.ZtunnelCSR(t, workload)
	issued, err := a.Sign(context.Background(), ca.Request{CSR: parseCSR(t, csrPEM), ID: workload, TTL: ttl})
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return issued
}

// parseChain parses every element of a returned chain.
func parseChain(t testing.TB, chain []string) [][]*x509.Certificate {
	t.Helper()
	out := make([][]*x509.Certificate, len(chain))
	for i, el := range chain {
		certs, err := pemutil.ParseCertificateBundle([]byte(el))
		if err != nil {
			t.Fatalf("chain element %d: %v", i, err)
		}
		out[i] = certs
	}
	return out
}

// verifySVID checks the chain the way a SPIFFE peer would: the leaf and
// the single-certificate middle elements against the bundle in the last
// element.
func verifySVID(t testing.TB, chain []string, now time.Time) spiffeid.ID {
	t.Helper()
	parsed := parseChain(t, chain)
	var certs []*x509.Certificate
	for _, el := range parsed[:len(parsed)-1] {
		certs = append(certs, el[0])
	}
	bundle := x509bundle.FromX509Authorities(td, parsed[len(parsed)-1])
	id, _, err := x509svid.Verify(certs, bundle, x509svid.WithTime(now))
	if err != nil {
		t.Fatalf("x509svid.Verify: %v", err)
	}
	return id
}
