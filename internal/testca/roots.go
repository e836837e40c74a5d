package testca

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// RootCerts returns the certificates of n new P-256 roots.
func RootCerts(t testing.TB, n int) []*x509.Certificate {
	t.Helper()
	out := make([]*x509.Certificate, n)
	for i := range out {
		out[i] = NewRoot(t, P256).Cert
	}
	return out
}

// Roots holds root certificates for a publisher's Roots func: Get may be
// called while a test Sets new ones.
type Roots struct {
	mu    sync.Mutex
	certs []*x509.Certificate
}

// Get returns the current roots.
func (r *Roots) Get() []*x509.Certificate {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.certs
}

// Set replaces the roots.
func (r *Roots) Set(certs ...*x509.Certificate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.certs = certs
}

// WritePEM writes certs, PEM-encoded, to a new file in t's temporary
// directory and returns its path.
func WritePEM(t testing.TB, certs ...*x509.Certificate) string {
	t.Helper()
	var b []byte
	for _, c := range certs {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	path := filepath.Join(t.TempDir(), "certs.pem")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
