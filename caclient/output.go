package caclient

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.step.sm/crypto/pemutil"
)

// summary is what Print says of a Result.
type summary struct {
	SPIFFEID  string    `json:"spiffe_id"`
	Serial    string    `json:"serial"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	Chain     []string  `json:"chain"`
	Roots     []string  `json:"roots"`
}

// Print writes the summary of r to w, as JSON or as text for a terminal.
func (r *Result) Print(w io.Writer, asJSON bool) error {
	s := summary{SPIFFEID: r.Leaf.URIs[0].String(), Serial: r.Leaf.SerialNumber.Text(16),
		NotBefore: r.Leaf.NotBefore.UTC(), NotAfter: r.Leaf.NotAfter.UTC()}
	for _, c := range r.Chain {
		s.Chain = append(s.Chain, c.Subject.String())
	}
	for _, c := range r.Roots {
		s.Roots = append(s.Roots, c.Subject.String())
	}
	if asJSON {
		return json.NewEncoder(w).Encode(s)
	}
	_, err := fmt.Fprintf(w, "spiffe_id:  %s\nserial:     %s\nvalidity:   %s .. %s (%s)\nchain:      leaf -> %s\nroots:      %s\n",
		s.SPIFFEID, s.Serial, s.NotBefore.Format(time.RFC3339), s.NotAfter.Format(time.RFC3339),
		s.NotAfter.Sub(s.NotBefore).Round(time.Second), strings.Join(append(s.Chain, "[root bundle]"), " -> "),
		strings.Join(s.Roots, "; "))
	return err
}

// WriteFiles writes the key (key.pem, 0600), the chain (cert-chain.pem)
// and the roots (root-cert.pem) into dir, as istio-agent lays them out.
func (r *Result) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	keyPEM, err := pemutil.Serialize(r.Key, pemutil.WithPKCS8(true))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "key.pem"), pem.EncodeToMemory(keyPEM), 0o600); err != nil {
		return err
	}
	chain := strings.Join(r.PEM[:len(r.PEM)-1], "")
	if err := os.WriteFile(filepath.Join(dir, "cert-chain.pem"), []byte(chain), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "root-cert.pem"), []byte(r.PEM[len(r.PEM)-1]), 0o600)
}

// ReadRoots reads the PEM roots that verify the CA's serving certificate
// (ztunnel's CA_ROOT_CA).
func ReadRoots(path string) (*x509.CertPool, error) {
	roots, err := pemutil.ReadCertificateBundle(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	return pool, nil
}
