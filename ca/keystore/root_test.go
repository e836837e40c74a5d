package keystore_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.step.sm/crypto/keyutil"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestLoadRootDir(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	other := testca.NewRoot(t, testca.P384)
	tests := []struct {
		name      string
		files     map[string][]byte
		wantRoots []*x509.Certificate
	}{
		{"istio root-cert.pem and root-key.pem", map[string][]byte{
			"root-cert.pem": pemCerts(root.Cert), "root-key.pem": pemKey(t, root.Key, "sec1"),
		}, []*x509.Certificate{root.Cert}},
		{"istio, a second root being rolled in", map[string][]byte{
			"root-cert.pem": pemCerts(root.Cert, other.Cert, root.Cert), "root-key.pem": pemKey(t, root.Key, "pkcs8"),
		}, []*x509.Certificate{root.Cert, other.Cert}},
		{"istio cacerts next to the root files", map[string][]byte{
			"root-cert.pem": pemCerts(root.Cert), "root-key.pem": pemKey(t, root.Key, "pkcs8"),
			"ca-cert.pem": pemCerts(other.Cert), "ca-key.pem": pemKey(t, other.Key, "pkcs8"),
		}, []*x509.Certificate{root.Cert}},
		{"cert-manager CA Secret, signing root moved first", map[string][]byte{
			"tls.crt": pemCerts(root.Cert), "tls.key": pemKey(t, root.Key, "sec1"), "ca.crt": pemCerts(other.Cert, root.Cert),
		}, []*x509.Certificate{root.Cert, other.Cert}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := keystore.LoadRootDir(writeDir(t, tt.files), nil)
			if err != nil {
				t.Fatalf("LoadRootDir: %v", err)
			}
			if !m.Cert.Equal(root.Cert) || !keyutil.Equal(m.Signer, root.Key) || len(m.Intermediates) != 0 || !sameCerts(m.Roots, tt.wantRoots) {
				t.Errorf("loaded cert %q, %d intermediates, %d roots; want the root, none, %d roots",
					m.Cert.Subject, len(m.Intermediates), len(m.Roots), len(tt.wantRoots))
			}
		})
	}
}

func TestLoadRootDirRefuses(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P256)
	tests := []struct {
		name    string
		files   map[string][]byte
		wantErr error
		wantMsg string
	}{
		{"empty directory", nil, keystore.ErrNoMaterial, "no CA material"},
		{"istio cacerts without root-key.pem", map[string][]byte{
			"ca-cert.pem": pemCerts(mid.Cert), "ca-key.pem": pemKey(t, mid.Key, "pkcs8"), "root-cert.pem": pemCerts(root.Cert),
		}, keystore.ErrIncomplete, "root-key.pem missing"},
		{"key of another CA", map[string][]byte{
			"root-cert.pem": pemCerts(root.Cert), "root-key.pem": pemKey(t, mid.Key, "pkcs8"),
		}, ca.ErrInvalidMaterial, "signing key does not match"},
		{"an intermediate, not a root", map[string][]byte{
			"tls.crt": pemCerts(mid.Cert), "tls.key": pemKey(t, mid.Key, "pkcs8"), "ca.crt": pemCerts(root.Cert),
		}, ca.ErrInvalidMaterial, "not in the root bundle"},
		{"a chain above the root", map[string][]byte{
			"tls.crt": pemCerts(root.Cert, mid.Cert), "tls.key": pemKey(t, root.Key, "pkcs8"), "ca.crt": pemCerts(root.Cert),
		}, ca.ErrInvalidMaterial, "besides the root"},
		{"root of path length 0", func() map[string][]byte {
			r := testca.NewRoot(t, testca.P256, func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = 0, true })
			return map[string][]byte{"root-cert.pem": pemCerts(r.Cert), "root-key.pem": pemKey(t, r.Key, "pkcs8")}
		}(), ca.ErrInvalidMaterial, "path length 0"},
		{"expired root", func() map[string][]byte {
			old := testca.NewRoot(t, testca.P256, testca.Validity(time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour)))
			return map[string][]byte{"root-cert.pem": pemCerts(old.Cert), "root-key.pem": pemKey(t, old.Key, "pkcs8")}
		}(), ca.ErrInvalidMaterial, "expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeDir(t, tt.files)
			_, err := keystore.LoadRootDir(dir, nil)
			if !errors.Is(err, tt.wantErr) || !strings.HasPrefix(err.Error(), "ca-root-dir "+dir+": ") || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("LoadRootDir = %v, want %v mentioning %q", err, tt.wantErr, tt.wantMsg)
			}
		})
	}
}

func TestGenerateIntermediate(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	now := time.Now().UTC().Truncate(time.Second)
	plugin := testca.NewRoot(t, testca.P384, testca.Validity(now.Add(-24*time.Hour), now.Add(3*365*24*time.Hour)))
	other := testca.NewRoot(t, testca.P256)
	root := &ca.Material{Signer: plugin.Key, Cert: plugin.Cert, Roots: []*x509.Certificate{plugin.Cert, other.Cert}}

	m, err := keystore.GenerateIntermediate(root, keystore.GenerateOptions{TrustDomain: td, Lifetime: 365 * 24 * time.Hour}, now)
	if err != nil {
		t.Fatalf("GenerateIntermediate: %v", err)
	}
	c := m.Cert
	if c.Subject.CommonName != keystore.IntermediateCommonName || len(c.Subject.Organization) != 1 || c.Subject.Organization[0] != td.Name() {
		t.Errorf("subject = %q", c.Subject)
	}
	if len(c.URIs) != 1 || c.URIs[0].String() != td.IDString() {
		t.Errorf("URIs = %v, want [%s]", c.URIs, td.IDString())
	}
	if !c.IsCA || !c.BasicConstraintsValid || c.MaxPathLen != 0 || !c.MaxPathLenZero || c.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign {
		t.Errorf("IsCA=%v MaxPathLen=%d (zero %v) KeyUsage=%#x; want a CA of path length 0 with certSign|cRLSign",
			c.IsCA, c.MaxPathLen, c.MaxPathLenZero, c.KeyUsage)
	}
	if !c.NotBefore.Equal(now.Add(-time.Hour)) || !c.NotAfter.Equal(now.Add(365*24*time.Hour)) {
		t.Errorf("validity %v to %v, want an hour before now for a year", c.NotBefore, c.NotAfter)
	}
	if err := c.CheckSignatureFrom(plugin.Cert); err != nil || !bytes.Equal(c.AuthorityKeyId, plugin.Cert.SubjectKeyId) {
		t.Errorf("not issued by the plug-in root (signature: %v, AKI %x, root SKI %x)", err, c.AuthorityKeyId, plugin.Cert.SubjectKeyId)
	}
	if keyutil.Equal(m.Signer, plugin.Key) || !sameCerts(m.Roots, root.Roots) || len(m.Intermediates) != 0 {
		t.Error("want a new key, the plug-in bundle as roots, no intermediates")
	}
	issueThroughIntermediate(t, td, m, now)

	t.Run("cut at the root's validity", func(t *testing.T) {
		short := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-time.Minute), now.Add(30*24*time.Hour)))
		m, err := keystore.GenerateIntermediate(short.Material(), keystore.GenerateOptions{TrustDomain: td, Lifetime: 365 * 24 * time.Hour}, now)
		if err != nil {
			t.Fatal(err)
		}
		if !m.Cert.NotBefore.Equal(short.Cert.NotBefore) || !m.Cert.NotAfter.Equal(short.Cert.NotAfter) {
			t.Errorf("validity %v to %v, want the root's %v to %v", m.Cert.NotBefore, m.Cert.NotAfter, short.Cert.NotBefore, short.Cert.NotAfter)
		}
	})
	refusals := map[string]*ca.Material{
		"expired root": testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-48*time.Hour), now.Add(-time.Hour))).Material(),
		"root of path length 0": testca.NewRoot(t, testca.P256, func(c *x509.Certificate) {
			c.MaxPathLen, c.MaxPathLenZero = 0, true
		}).Material(),
		"no root": nil,
	}
	for name, r := range refusals {
		t.Run(name, func(t *testing.T) {
			if _, err := keystore.GenerateIntermediate(r, keystore.GenerateOptions{TrustDomain: td}, now); err == nil {
				t.Fatal("GenerateIntermediate succeeded")
			}
		})
	}
	t.Run("no trust domain", func(t *testing.T) {
		if _, err := keystore.GenerateIntermediate(root, keystore.GenerateOptions{}, now); err == nil {
			t.Fatal("GenerateIntermediate accepted an empty trust domain")
		}
	})
}

// issueThroughIntermediate checks that an Authority serving m returns the
// chain [leaf, intermediate, root bundle] and that the leaf verifies with
// the bundle alone as trust anchors.
func issueThroughIntermediate(t *testing.T, td spiffeid.TrustDomain, m *ca.Material, now time.Time) {
	t.Helper()
	issued := issueWith(t, td, m, now)
	if len(issued.Chain) != 3 || issued.Chain[1] != string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: m.Cert.Raw})) ||
		issued.Chain[2] != string(pemCerts(m.Roots...)) {
		t.Fatalf("chain has %d elements, want [leaf, intermediate, root bundle]", len(issued.Chain))
	}
	opts := x509.VerifyOptions{Roots: x509.NewCertPool(), Intermediates: x509.NewCertPool(), CurrentTime: now}
	for _, r := range m.Roots {
		opts.Roots.AddCert(r)
	}
	opts.Intermediates.AppendCertsFromPEM([]byte(issued.Chain[1]))
	if _, err := issued.Cert.Verify(opts); err != nil {
		t.Errorf("leaf does not verify with the intermediate against the roots: %v", err)
	}
}
