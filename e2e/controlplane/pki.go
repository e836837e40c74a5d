package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the generated credentials and the files they were written to.
type pki struct {
	caCert *x509.Certificate
	caKey  crypto.Signer
	saKey  *ecdsa.PrivateKey

	caPEM, adminCertPEM, adminKeyPEM []byte

	caFile, servingCertFile, servingKeyFile string
	adminCertFile, adminKeyFile             string
	saKeyFile, saPubFile                    string
}

// newPKI generates a CA, the apiserver serving cert, an admin client cert
// and the service-account signing key, and writes them into dir.
func newPKI(dir string) (*pki, error) {
	p := &pki{
		caFile:          filepath.Join(dir, "ca.crt"),
		servingCertFile: filepath.Join(dir, "apiserver.crt"),
		servingKeyFile:  filepath.Join(dir, "apiserver.key"),
		adminCertFile:   filepath.Join(dir, "admin.crt"),
		adminKeyFile:    filepath.Join(dir, "admin.key"),
		saKeyFile:       filepath.Join(dir, "sa.key"),
		saPubFile:       filepath.Join(dir, "sa.pub"),
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	steps := []func() error{p.makeCA, p.makeServing, p.makeAdmin, p.makeSAKey}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, fmt.Errorf("pki: %w", err)
		}
	}
	return p, nil
}

func (p *pki) makeCA() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := template(pkix.Name{CommonName: "workload-ca e2e control-plane CA"})
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return err
	}
	if p.caCert, err = x509.ParseCertificate(der); err != nil {
		return err
	}
	p.caKey = key
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return os.WriteFile(p.caFile, p.caPEM, 0o600)
}

func (p *pki) makeServing() error {
	tmpl := template(pkix.Name{CommonName: "kube-apiserver"})
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	tmpl.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 0, 0, 1)}
	certPEM, keyPEM, err := p.issue(tmpl)
	if err != nil {
		return err
	}
	return writePair(p.servingCertFile, certPEM, p.servingKeyFile, keyPEM)
}

func (p *pki) makeAdmin() error {
	tmpl := template(pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}})
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	var err error
	if p.adminCertPEM, p.adminKeyPEM, err = p.issue(tmpl); err != nil {
		return err
	}
	return writePair(p.adminCertFile, p.adminCertPEM, p.adminKeyFile, p.adminKeyPEM)
}

// RotateServiceAccountKey replaces the service account signing key with a
// new one, and the old key is no longer trusted: tokens it signed stop
// verifying, as when an operator revokes a leaked key. It takes effect
// when the apiserver next starts (StopAPIServer, StartAPIServer).
func (c *ControlPlane) RotateServiceAccountKey() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pki.makeSAKey()
}

func (p *pki) makeSAKey() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return err
	}
	p.saKey = key
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	return writePair(p.saPubFile, pubPEM, p.saKeyFile, keyPEM)
}

// issue signs tmpl with the CA for a fresh P-256 key.
func (p *pki) issue(tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return nil, nil, err
	}
	if keyPEM, err = encodeKey(key); err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// template returns a certificate template valid from an hour ago for a year.
func template(subject pkix.Name) *x509.Certificate {
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
	}
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func writePair(certFile string, certPEM []byte, keyFile string, keyPEM []byte) error {
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		return err
	}
	return os.WriteFile(keyFile, keyPEM, 0o600)
}
