package ca_test

import (
	"context"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestSignLeafFields(t *testing.T) {
	now := testNow()
	root := testca.NewRoot(t, testca.P256)
	a := newAuthority(t, root.Material(), now)
	tests := []struct {
		key    testca.KeyType
		wantKU x509.KeyUsage
	}{
		{testca.P256, x509.KeyUsageDigitalSignature},
		{testca.P384, x509.KeyUsageDigitalSignature},
		{testca.RSA2048, x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment},
		{testca.Ed25519, x509.KeyUsageDigitalSignature},
	}
	for _, tt := range tests {
		t.Run(string(tt.key), func(t *testing.T) {
			csr := parseCSR(t, testca.CSR(t, testca.NewKey(t, tt.key), workload.String()))
			issued, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: workload})
			if err != nil {
				t.Fatalf("Sign: %v", err)
			}
			leaf := issued.Cert
			checkWorkloadLeaf(t, leaf, tt.wantKU)
			if want := now.Add(-ca.DefaultBackdate); !leaf.NotBefore.Equal(want) {
				t.Errorf("NotBefore = %v, want %v (backdated)", leaf.NotBefore, want)
			}
			if want := now.Add(ca.DefaultTTL); !leaf.NotAfter.Equal(want) {
				t.Errorf("NotAfter = %v, want %v", leaf.NotAfter, want)
			}
			if diff := cmp.Diff(root.Cert.SubjectKeyId, leaf.AuthorityKeyId); diff != "" {
				t.Errorf("AuthorityKeyId differs from the issuer's SubjectKeyId (-want +got):\n%s", diff)
			}
			if id := verifySVID(t, issued.Chain, now); id != workload {
				t.Errorf("verified ID = %s, want %s", id, workload)
			}
		})
	}
}

// checkWorkloadLeaf checks the fields every X.509-SVID we issue must have.
func checkWorkloadLeaf(t *testing.T, leaf *x509.Certificate, wantKU x509.KeyUsage) {
	t.Helper()
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != workload.String() {
		t.Errorf("URIs = %v, want exactly [%s]", leaf.URIs, workload)
	}
	if len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0 {
		t.Errorf("unexpected SANs: %v %v %v", leaf.DNSNames, leaf.IPAddresses, leaf.EmailAddresses)
	}
	if string(leaf.RawSubject) != "\x30\x00" {
		t.Errorf("subject = %q, want empty", leaf.Subject)
	}
	if !sanExtensionCritical(leaf) {
		t.Error("SubjectAltName extension is not critical (required with an empty subject)")
	}
	if !leaf.BasicConstraintsValid || leaf.IsCA {
		t.Errorf("BasicConstraintsValid=%v IsCA=%v, want true/false", leaf.BasicConstraintsValid, leaf.IsCA)
	}
	if leaf.KeyUsage != wantKU {
		t.Errorf("KeyUsage = %#x, want %#x", leaf.KeyUsage, wantKU)
	}
	wantEKU := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	if diff := cmp.Diff(wantEKU, leaf.ExtKeyUsage); diff != "" {
		t.Errorf("ExtKeyUsage (-want +got):\n%s", diff)
	}
	if leaf.SerialNumber.Sign() <= 0 || leaf.SerialNumber.BitLen() > 128 {
		t.Errorf("serial %x is not positive and below 2^128", leaf.SerialNumber)
	}
}

func sanExtensionCritical(c *x509.Certificate) bool {
	for _, e := range c.Extensions {
		if e.Id.Equal(asn1.ObjectIdentifier{2, 5, 29, 17}) {
			return e.Critical
		}
	}
	return false
}

func TestSignSerialsAreRandom(t *testing.T) {
	a := newAuthority(t, testca.NewRoot(t, testca.P256).Material(), testNow())
	seen := map[string]bool{}
	var longest int
	for range 64 {
		s := signZtunnel(t, a, 0).Cert.SerialNumber
		if seen[s.String()] {
			t.Fatalf("serial %x issued twice", s)
		}
		seen[s.String()] = true
		longest = max(longest, s.BitLen())
	}
	// 64 uniform 128-bit serials all shorter than 120 bits: p = 2^-512.
	if longest < 120 {
		t.Errorf("longest serial has %d bits; want close to 128", longest)
	}
}

func TestSignValidity(t *testing.T) {
	now := testNow()
	longCA := testca.Validity(now.Add(-time.Hour), now.Add(365*24*time.Hour))
	tests := []struct {
		name          string
		ttl           time.Duration
		caValidity    testca.Option
		wantNotBefore time.Time
		wantNotAfter  time.Time
	}{
		{"zero TTL gets the default", 0, longCA, now.Add(-2 * time.Minute), now.Add(24 * time.Hour)},
		{"negative TTL gets the default", -time.Hour, longCA, now.Add(-2 * time.Minute), now.Add(24 * time.Hour)},
		{"TTL under the max is kept", time.Hour, longCA, now.Add(-2 * time.Minute), now.Add(time.Hour)},
		{"TTL equal to the max is kept", ca.DefaultMaxTTL, longCA, now.Add(-2 * time.Minute), now.Add(ca.DefaultMaxTTL)},
		{"TTL over the max is clamped, not refused", 90 * 24 * time.Hour, longCA, now.Add(-2 * time.Minute), now.Add(ca.DefaultMaxTTL)},
		{"NotAfter capped at the issuer's", 24 * time.Hour, testca.Validity(now.Add(-time.Hour), now.Add(3*time.Hour)), now.Add(-2 * time.Minute), now.Add(3 * time.Hour)},
		{"NotBefore not before the issuer's", 24 * time.Hour, testca.Validity(now.Add(-30*time.Second), now.Add(48*time.Hour)), now.Add(-30 * time.Second), now.Add(24 * time.Hour)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAuthority(t, testca.NewRoot(t, testca.P256, tt.caValidity).Material(), now)
			leaf := signZtunnel(t, a, tt.ttl).Cert
			if !leaf.NotBefore.Equal(tt.wantNotBefore) || !leaf.NotAfter.Equal(tt.wantNotAfter) {
				t.Errorf("validity = [%v, %v], want [%v, %v]", leaf.NotBefore, leaf.NotAfter, tt.wantNotBefore, tt.wantNotAfter)
			}
		})
	}
}

// MaxValidity bounds NotAfter - NotBefore, the backdate included; it
// never lengthens a shorter TTL.
func TestSignMaxValidity(t *testing.T) {
	now := testNow()
	a := newAuthority(t, testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(365*24*time.Hour))).Material(), now)
	tests := []struct {
		name             string
		ttl, maxValidity time.Duration
		wantValidity     time.Duration
	}{
		{"bound shorter than TTL plus backdate", 24 * time.Hour, time.Hour, time.Hour},
		{"bound longer than TTL plus backdate", time.Hour, 24 * time.Hour, time.Hour + 2*time.Minute},
		{"no bound", time.Hour, 0, time.Hour + 2*time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			csrPEM, _ := testca.ZtunnelCSR(t, workload)
			issued, err := a.Sign(context.Background(), ca.Request{CSR: parseCSR(t, csrPEM), ID: workload, TTL: tt.ttl, MaxValidity: tt.maxValidity})
			if err != nil {
				t.Fatal(err)
			}
			if got := issued.Cert.NotAfter.Sub(issued.Cert.NotBefore); got != tt.wantValidity {
				t.Errorf("validity %v, want %v", got, tt.wantValidity)
			}
		})
	}
}

// MaxTTL caps NotAfter - now after the default and the maximum apply; it
// never lengthens a shorter lifetime.
func TestSignMaxTTL(t *testing.T) {
	now := testNow()
	cfg := ca.Config{TrustDomain: td, DefaultTTL: time.Hour, MaxTTL: 24 * time.Hour, Clock: testingclock.NewFakePassiveClock(now)}
	a, err := ca.New(cfg, testca.NewRoot(t, testca.P256).Material())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		ttl, maxTTL time.Duration
		want        time.Duration // NotAfter - now
	}{
		{"caps an explicit TTL", 12 * time.Hour, 90 * time.Minute, 90 * time.Minute},
		{"caps the default", 0, 30 * time.Minute, 30 * time.Minute},
		{"never lengthens the default", 0, 2 * time.Hour, time.Hour},
		{"never lengthens past the maximum", 48 * time.Hour, 36 * time.Hour, 24 * time.Hour},
		{"a short cap is from now, not from the backdated NotBefore", 12 * time.Hour, time.Minute, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			csrPEM, _ := testca.ZtunnelCSR(t, workload)
			issued, err := a.Sign(context.Background(), ca.Request{CSR: parseCSR(t, csrPEM), ID: workload, TTL: tt.ttl, MaxTTL: tt.maxTTL})
			if err != nil {
				t.Fatal(err)
			}
			if got := issued.Cert.NotAfter.Sub(now); got != tt.want {
				t.Errorf("NotAfter - now = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSignConfiguredTTLs(t *testing.T) {
	now := testNow()
	cfg := ca.Config{TrustDomain: td, DefaultTTL: time.Hour, MaxTTL: 2 * time.Hour, Backdate: time.Minute,
		Clock: testingclock.NewFakePassiveClock(now)}
	a, err := ca.New(cfg, testca.NewRoot(t, testca.P256).Material())
	if err != nil {
		t.Fatal(err)
	}
	for ttl, want := range map[time.Duration]time.Duration{0: time.Hour, 5 * time.Hour: 2 * time.Hour} {
		leaf := signZtunnel(t, a, ttl).Cert
		if got := leaf.NotAfter.Sub(now); got != want {
			t.Errorf("TTL %v: lifetime %v, want %v", ttl, got, want)
		}
		if got := now.Sub(leaf.NotBefore); got != time.Minute {
			t.Errorf("backdate %v, want 1m", got)
		}
	}
}

func TestSignRefuses(t *testing.T) {
	now := testNow()
	a := newAuthority(t, testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(time.Hour))).Material(), now)
	p256 := testca.NewKey(t, testca.P256)
	other := spiffeid.RequireFromPath(td, "/ns/demo/sa/other")
	foreign := spiffeid.RequireFromString("spiffe://evil.example/ns/demo/sa/default")
	tests := []struct {
		name    string
		req     ca.Request
		wantErr error
	}{
		{"no CSR", ca.Request{ID: workload}, ca.ErrInvalidCSR},
		{"CSR URI SAN is another identity", ca.Request{CSR: parseCSR(t, testca.CSR(t, p256, other.String())), ID: workload}, ca.ErrInvalidCSR},
		{"identity in a foreign trust domain", ca.Request{CSR: parseCSR(t, testca.CSR(t, p256, foreign.String())), ID: foreign}, ca.ErrForeignTrustDomain},
		{"zero identity", ca.Request{CSR: parseCSR(t, testca.CSR(t, p256))}, ca.ErrForeignTrustDomain},
		{"unparsed CSR with two URIs", ca.Request{CSR: twoURICSR(t), ID: workload}, ca.ErrInvalidCSR},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := a.Sign(context.Background(), tt.req); !errors.Is(err, tt.wantErr) {
				t.Fatalf("Sign error = %v, want %v", err, tt.wantErr)
			}
		})
	}
	t.Run("no URI SAN is granted the identity", func(t *testing.T) {
		issued, err := a.Sign(context.Background(), ca.Request{CSR: parseCSR(t, testca.CSR(t, p256)), ID: workload})
		if err != nil {
			t.Fatalf("Sign: %v", err)
		}
		checkWorkloadLeaf(t, issued.Cert, x509.KeyUsageDigitalSignature)
	})
	t.Run("cancelled context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := a.Sign(ctx, ca.Request{CSR: parseCSR(t, testca.CSR(t, p256)), ID: workload})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Sign error = %v, want context.Canceled", err)
		}
	})
}

// twoURICSR is a CSR that did not go through ParseCSR, which would refuse it.
func twoURICSR(t *testing.T) *x509.CertificateRequest {
	der := csrDER(t, testca.CSR(t, testca.NewKey(t, testca.P256), workload.String(), workload.String()))
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

func TestSignAfterIssuerExpiry(t *testing.T) {
	now := testNow()
	clk := testingclock.NewFakePassiveClock(now)
	a, err := ca.New(ca.Config{TrustDomain: td, Clock: clk},
		testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(time.Hour))).Material())
	if err != nil {
		t.Fatal(err)
	}
	clk.SetTime(now.Add(2 * time.Hour))
	csr := parseCSR(t, testca.CSR(t, testca.NewKey(t, testca.P256)))
	_, err = a.Sign(context.Background(), ca.Request{CSR: csr, ID: workload})
	if err == nil || errors.Is(err, ca.ErrInvalidCSR) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("Sign error = %v, want a CA error saying the issuer expired", err)
	}
}

func TestRandomSourceFailure(t *testing.T) {
	cfg := ca.Config{TrustDomain: td, Rand: zeroReader{}}
	a, err := ca.New(cfg, testca.NewRoot(t, testca.P256).Material())
	if err != nil {
		t.Fatal(err)
	}
	csr := parseCSR(t, testca.CSR(t, testca.NewKey(t, testca.P256)))
	if _, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: workload}); err == nil || !strings.Contains(err.Error(), "serial") {
		t.Fatalf("Sign error = %v, want a serial number error", err)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }
