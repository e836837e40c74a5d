package ca_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// The CA encodes its leaves itself; x509.CreateCertificate is the
// reference. These tests rebuild every issued leaf's template from the
// parsed leaf, have CreateCertificate sign it with the same CA, and require
// the same TBSCertificate, byte for byte.

func TestIssuedLeafIsWhatCreateCertificateBuilds(t *testing.T) {
	now := testNow()
	// Years from 2050 on are GeneralizedTime, earlier ones UTCTime.
	late := time.Date(2049, 12, 31, 23, 0, 0, 0, time.UTC)
	lateCA := testca.Validity(late.Add(-time.Hour), late.Add(30*24*time.Hour))
	tests := []struct {
		name    string
		caKey   testca.KeyType
		subject testca.KeyType
		opts    []testca.Option
		now     time.Time
		ttl     time.Duration
		serving []string // a serving certificate for these names instead of an SVID
	}{
		{name: "P-256 CA, ztunnel key", caKey: testca.P256, subject: testca.P256, now: now},
		{name: "P-384 CA, P-384 key", caKey: testca.P384, subject: testca.P384, now: now},
		{name: "P-521 CA (a KMS key), P-256 key", caKey: testca.P521, subject: testca.P256, now: now},
		{name: "RSA CA, RSA key (key encipherment too)", caKey: testca.RSA2048, subject: testca.RSA2048, now: now},
		{name: "Ed25519 CA, Ed25519 key", caKey: testca.Ed25519, subject: testca.Ed25519, now: now},
		{name: "validity across 2050", caKey: testca.P256, subject: testca.P256, opts: []testca.Option{lateCA}, now: late, ttl: 24 * time.Hour},
		{name: "serving certificate", caKey: testca.P256, subject: testca.P256, now: now, serving: []string{"workload-ca.istio-system.svc", "workload-ca"}},
		{name: "serving certificate, RSA CA", caKey: testca.RSA2048, subject: testca.P256, now: now, serving: []string{"localhost"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := testca.NewRoot(t, tt.caKey, tt.opts...)
			a := newAuthority(t, root.Material(), tt.now)
			key := testca.NewKey(t, tt.subject)
			// Enough serials that some have the top bit set (a leading
			// zero byte in DER) and some do not.
			for range 8 {
				leaf := issueTo(t, a, key, tt.ttl, tt.serving)
				requireCreateCertificateTBS(t, leaf, root)
			}
		})
	}
}

func TestIssuedLeafUnderIntermediateIsWhatCreateCertificateBuilds(t *testing.T) {
	inter := testca.NewIntermediate(t, testca.NewRoot(t, testca.RSA2048), testca.P256)
	a := newAuthority(t, inter.Material(), testNow())
	leaf := issueTo(t, a, testca.NewKey(t, testca.P256), 0, nil)
	requireCreateCertificateTBS(t, leaf, inter)
}

func FuzzIssuedLeafIsWhatCreateCertificateBuilds(f *testing.F) {
	f.Add([]byte{0x80, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, "/ns/demo/sa/default", int64(0), uint32(3600))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, "/ns/a/sa/b", int64(-1), uint32(1))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "/ns/zero/sa/serial", int64(86400*365*80), uint32(86400*90))
	f.Add([]byte{0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, "/x", int64(1<<40), uint32(86400*365))
	root := testca.NewRoot(f, testca.P256, testca.Validity(time.Unix(0, 0), time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)))
	key := testca.NewKey(f, testca.P256)
	csr := parseCSR(f, testca.CSR(f, key))
	f.Fuzz(func(t *testing.T, serial []byte, path string, unix int64, ttlSeconds uint32) {
		id, err := spiffeid.FromPath(td, path)
		if err != nil || len(serial) != 16 {
			return
		}
		// Any second of the root's life but its first and last hour, 1970
		// to 2100: both time encodings.
		span := int64(root.Cert.NotAfter.Sub(root.Cert.NotBefore)/time.Second) - 2*3600
		now := root.Cert.NotBefore.Add(time.Hour + time.Duration(((unix%span)+span)%span)*time.Second)
		a, err := ca.New(ca.Config{
			TrustDomain: td,
			Clock:       testingclock.NewFakePassiveClock(now),
			Rand:        io.MultiReader(bytes.NewReader(serial), rand.Reader),
			MaxTTL:      time.Duration(ttlSeconds+1) * time.Second,
		}, root.Material())
		if err != nil {
			t.Fatalf("ca.New: %v", err)
		}
		issued, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: id, TTL: time.Duration(ttlSeconds) * time.Second})
		if err != nil {
			t.Fatalf("Sign: %v", err)
		}
		requireCreateCertificateTBS(t, issued.Cert, root)
	})
}

// issueTo issues an SVID for workload to key, or a serving certificate for
// dnsNames if there are any.
func issueTo(t *testing.T, a *ca.Authority, key crypto.Signer, ttl time.Duration, dnsNames []string) *x509.Certificate {
	t.Helper()
	if len(dnsNames) > 0 {
		leaf, _, err := a.IssueServing(context.Background(), key.Public(), dnsNames, ttl)
		if err != nil {
			t.Fatalf("IssueServing: %v", err)
		}
		return leaf
	}
	issued, err := a.Sign(context.Background(), ca.Request{CSR: parseCSR(t, testca.CSR(t, key)), ID: workload, TTL: ttl})
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return issued.Cert
}

// requireCreateCertificateTBS signs the template of leaf with issuer
// through x509.CreateCertificate and requires the same TBSCertificate and
// signature algorithm.
func requireCreateCertificateTBS(t *testing.T, leaf *x509.Certificate, issuer *testca.CA) {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber:          leaf.SerialNumber,
		NotBefore:             leaf.NotBefore,
		NotAfter:              leaf.NotAfter,
		BasicConstraintsValid: true,
		KeyUsage:              leaf.KeyUsage,
		ExtKeyUsage:           leaf.ExtKeyUsage,
		AuthorityKeyId:        leaf.AuthorityKeyId,
		DNSNames:              leaf.DNSNames,
		URIs:                  leaf.URIs,
	}
	want := testca.Sign(t, tmpl, issuer.Cert, leaf.PublicKey, issuer.Key)
	if !bytes.Equal(leaf.RawTBSCertificate, want.RawTBSCertificate) {
		t.Fatalf("TBSCertificate differs from x509.CreateCertificate's:\n got %x\nwant %x", leaf.RawTBSCertificate, want.RawTBSCertificate)
	}
	if leaf.SignatureAlgorithm != want.SignatureAlgorithm {
		t.Fatalf("signature algorithm %v, x509.CreateCertificate chose %v", leaf.SignatureAlgorithm, want.SignatureAlgorithm)
	}
	if err := leaf.CheckSignatureFrom(issuer.Cert); err != nil {
		t.Fatalf("signature: %v", err)
	}
}

// lyingSigner claims the CA's public key but signs with another key, as a
// misconfigured KMS key version or a faulty HSM would.
type lyingSigner struct {
	crypto.Signer // signs
	public        crypto.PublicKey
}

func (s lyingSigner) Public() crypto.PublicKey { return s.public }

// garbageSigner returns bytes that are no signature at all.
type garbageSigner struct{ crypto.Signer }

func (garbageSigner) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return []byte{0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01}, nil
}

func TestSignRefusesWhatAFaultySignerSigned(t *testing.T) {
	for _, tt := range []struct {
		name   string
		signer func(root *testca.CA) crypto.Signer
	}{
		{"signature by another key", func(root *testca.CA) crypto.Signer {
			return lyingSigner{Signer: testca.NewKey(t, testca.P256), public: root.Key.Public()}
		}},
		{"not a signature", func(root *testca.CA) crypto.Signer { return garbageSigner{root.Key} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := testca.NewRoot(t, testca.P256)
			m := root.Material()
			m.Signer = tt.signer(root)
			a := newAuthority(t, m, testNow())
			csrPEM, _ := testca.ZtunnelCSR(t, workload)
			issued, err := a.Sign(context.Background(), ca.Request{CSR: parseCSR(t, csrPEM), ID: workload})
			if err == nil {
				t.Fatalf("issued %v signed by a faulty signer", issued.Cert.SerialNumber)
			}
			if errors.Is(err, ca.ErrInvalidCSR) || errors.Is(err, ca.ErrForeignTrustDomain) {
				t.Fatalf("the CA's own failure reported as the caller's: %v", err)
			}
		})
	}
}

func TestNewRefusesASigningKeyItCannotSignWith(t *testing.T) {
	_, err := ca.New(ca.Config{TrustDomain: td}, testca.NewRoot(t, testca.P224).Material())
	if !errors.Is(err, ca.ErrInvalidMaterial) {
		t.Fatalf("P-224 CA: got %v, want ErrInvalidMaterial", err)
	}
}
