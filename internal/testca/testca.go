package testca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/ca"
)

// KeyType names a key algorithm and size.
type KeyType string

// Key types. P224 and RSA1024 exist to test rejection of weak keys.
const (
	P256    KeyType = "P-256"
	P384    KeyType = "P-384"
	P521    KeyType = "P-521"
	P224    KeyType = "P-224"
	RSA1024 KeyType = "RSA-1024"
	RSA2048 KeyType = "RSA-2048"
	Ed25519 KeyType = "Ed25519"
)

// NewKey generates a key of type kt.
func NewKey(t testing.TB, kt KeyType) crypto.Signer {
	t.Helper()
	var (
		k   crypto.Signer
		err error
	)
	switch kt {
	case P256:
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case P384:
		k, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case P521:
		k, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	case P224:
		k, err = ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	case RSA1024:
		k, err = rsa.GenerateKey(rand.Reader, 1024) //nolint:gosec // deliberately weak: tests check it is refused
	case RSA2048:
		k, err = rsa.GenerateKey(rand.Reader, 2048)
	case Ed25519:
		_, k, err = ed25519.GenerateKey(rand.Reader)
	default:
		err = fmt.Errorf("unknown key type %q", kt)
	}
	if err != nil {
		t.Fatalf("testca: generating %s key: %v", kt, err)
	}
	return k
}

// CA is a test certificate authority: a root, or an intermediate under
// Parent.
type CA struct {
	Key    crypto.Signer
	Cert   *x509.Certificate
	Parent *CA
}

// Option edits a CA certificate template before it is signed.
type Option func(*x509.Certificate)

// Validity sets the CA certificate's validity period.
func Validity(notBefore, notAfter time.Time) Option {
	return func(c *x509.Certificate) { c.NotBefore, c.NotAfter = notBefore, notAfter }
}

// NewRoot returns a self-signed root CA valid from an hour ago for a year.
func NewRoot(t testing.TB, kt KeyType, opts ...Option) *CA {
	t.Helper()
	return newCA(t, nil, kt, "root", opts)
}

// NewIntermediate returns a CA signed by parent, valid from an hour ago for
// a year unless opts say otherwise.
func NewIntermediate(t testing.TB, parent *CA, kt KeyType, opts ...Option) *CA {
	t.Helper()
	return newCA(t, parent, kt, "intermediate", opts)
}

func newCA(t testing.TB, parent *CA, kt KeyType, role string, opts []Option) *CA {
	t.Helper()
	key := NewKey(t, kt)
	serial := randomSerial(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"testca"}, CommonName: fmt.Sprintf("testca %s %x", role, serial)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		BasicConstraintsValid: true,
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	for _, o := range opts {
		o(tmpl)
	}
	parentCert, parentKey := tmpl, key
	if parent != nil {
		parentCert, parentKey = parent.Cert, parent.Key
	}
	return &CA{Key: key, Cert: Sign(t, tmpl, parentCert, key.Public(), parentKey), Parent: parent}
}

// Sign signs tmpl with parent and returns the parsed certificate.
func Sign(t testing.TB, tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		t.Fatalf("testca: signing %q: %v", tmpl.Subject, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testca: parsing %q: %v", tmpl.Subject, err)
	}
	return cert
}

// NewLeaf issues a P-256 leaf for the URI SAN uri (a SPIFFE ID) under
// parent, valid from an hour ago until notAfter.
func NewLeaf(t testing.TB, parent *CA, uri string, notAfter time.Time) *x509.Certificate {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	key := NewKey(t, P256)
	return Sign(t, &x509.Certificate{SerialNumber: big.NewInt(7), URIs: []*url.URL{u},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter}, parent.Cert, key.Public(), parent.Key)
}

// Root returns the root at the top of c's chain.
func (c *CA) Root() *CA {
	for c.Parent != nil {
		c = c.Parent
	}
	return c
}

// Material returns c as signing material: its intermediates up to, not
// including, its root, and a root bundle of its root followed by
// extraRoots.
func (c *CA) Material(extraRoots ...*x509.Certificate) *ca.Material {
	m := &ca.Material{Signer: c.Key, Cert: c.Cert}
	for p := c.Parent; p != nil && p.Parent != nil; p = p.Parent {
		m.Intermediates = append(m.Intermediates, p.Cert)
	}
	m.Roots = append([]*x509.Certificate{c.Root().Cert}, extraRoots...)
	return m
}

// CertPEM returns c's certificate PEM-encoded.
func (c *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Cert.Raw})
}

// BundlePEM returns the certificates of cas PEM-encoded, in order.
func BundlePEM(cas ...*CA) []byte {
	var b []byte
	for _, c := range cas {
		b = append(b, c.CertPEM()...)
	}
	return b
}

// Certs returns the certificates of cas, in order.
func Certs(cas ...*CA) []*x509.Certificate {
	out := make([]*x509.Certificate, 0, len(cas))
	for _, c := range cas {
		out = append(out, c.Cert)
	}
	return out
}

// KeyPEM returns c's private key PEM-encoded as PKCS#8.
func (c *CA) KeyPEM(t testing.TB) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(c.Key)
	if err != nil {
		t.Fatalf("testca: key: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func randomSerial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		t.Fatalf("testca: serial: %v", err)
	}
	return n.Add(n, big.NewInt(1))
}
