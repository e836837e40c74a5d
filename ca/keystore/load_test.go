package keystore_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestLoadDir(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	otherRoot := testca.NewRoot(t, testca.P384)
	mid := testca.NewIntermediate(t, root, testca.P256)
	signing := testca.NewIntermediate(t, mid, testca.P256)
	rsaRoot := testca.NewRoot(t, testca.RSA2048)
	tests := []struct {
		name      string
		files     map[string][]byte
		wantCert  *x509.Certificate
		wantMid   []*x509.Certificate
		wantRoots []*x509.Certificate
	}{
		{"istio, self-signed root", map[string][]byte{
			"ca-cert.pem": pemCerts(root.Cert), "ca-key.pem": pemKey(t, root.Key, "sec1"), "root-cert.pem": pemCerts(root.Cert),
		}, root.Cert, nil, []*x509.Certificate{root.Cert}},
		{"istio, RSA PKCS#1 key", map[string][]byte{
			"ca-cert.pem": pemCerts(rsaRoot.Cert), "ca-key.pem": pemKey(t, rsaRoot.Key, "pkcs1"), "root-cert.pem": pemCerts(rsaRoot.Cert),
		}, rsaRoot.Cert, nil, []*x509.Certificate{rsaRoot.Cert}},
		{"istio, openssl EC PARAMETERS before the key", map[string][]byte{
			"ca-cert.pem": pemCerts(root.Cert), "ca-key.pem": pemKey(t, root.Key, "ecparams+sec1"), "root-cert.pem": pemCerts(root.Cert),
		}, root.Cert, nil, []*x509.Certificate{root.Cert}},
		{"istio, cert-chain including the root", map[string][]byte{
			"ca-cert.pem": pemCerts(signing.Cert), "ca-key.pem": pemKey(t, signing.Key, "pkcs8"), "root-cert.pem": pemCerts(root.Cert),
			"cert-chain.pem": pemCerts(signing.Cert, mid.Cert, root.Cert),
		}, signing.Cert, []*x509.Certificate{mid.Cert}, []*x509.Certificate{root.Cert}},
		{"istio, cert-chain without the root, multi-root bundle", map[string][]byte{
			"ca-cert.pem": pemCerts(signing.Cert), "ca-key.pem": pemKey(t, signing.Key, "pkcs8"),
			"root-cert.pem": pemCerts(root.Cert, otherRoot.Cert, root.Cert), "cert-chain.pem": pemCerts(signing.Cert, mid.Cert),
		}, signing.Cert, []*x509.Certificate{mid.Cert}, []*x509.Certificate{root.Cert, otherRoot.Cert}},
		{"cert-manager, tls.crt with intermediates", map[string][]byte{
			"tls.crt": pemCerts(signing.Cert, mid.Cert), "tls.key": pemKey(t, signing.Key, "sec1"), "ca.crt": pemCerts(root.Cert),
		}, signing.Cert, []*x509.Certificate{mid.Cert}, []*x509.Certificate{root.Cert}},
		{"cert-manager, self-signed root", map[string][]byte{
			"tls.crt": pemCerts(root.Cert), "tls.key": pemKey(t, root.Key, "pkcs8"), "ca.crt": pemCerts(root.Cert),
		}, root.Cert, nil, []*x509.Certificate{root.Cert}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := keystore.LoadDir(writeDir(t, tt.files), nil)
			if err != nil {
				t.Fatalf("LoadDir: %v", err)
			}
			if !m.Cert.Equal(tt.wantCert) || !sameCerts(m.Intermediates, tt.wantMid) || !sameCerts(m.Roots, tt.wantRoots) {
				t.Errorf("loaded cert %q, %d intermediates, %d roots; want %q, %d, %d",
					m.Cert.Subject, len(m.Intermediates), len(m.Roots), tt.wantCert.Subject, len(tt.wantMid), len(tt.wantRoots))
			}
		})
	}
}

func TestLoadDirRefuses(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	key := pemKey(t, root.Key, "pkcs8")
	cert := pemCerts(root.Cert)
	tests := []struct {
		name    string
		files   map[string][]byte
		wantErr error
		wantMsg string // after "ca-dir <dir>: "
	}{
		{"empty directory", nil, keystore.ErrNoMaterial, "no CA material"},
		{"istio without key", map[string][]byte{"ca-cert.pem": cert, "root-cert.pem": cert}, keystore.ErrIncomplete,
			"ca-key.pem missing: incomplete CA material"},
		{"istio without root", map[string][]byte{"ca-cert.pem": cert, "ca-key.pem": key}, keystore.ErrIncomplete,
			"root-cert.pem missing: incomplete CA material"},
		{"only cert-chain.pem", map[string][]byte{"cert-chain.pem": cert}, keystore.ErrIncomplete,
			"ca-cert.pem missing: incomplete CA material"},
		{"cert-manager without ca.crt", map[string][]byte{"tls.crt": cert, "tls.key": key}, keystore.ErrIncomplete,
			"ca.crt missing: incomplete CA material"},
		{"key of another CA", map[string][]byte{"ca-cert.pem": cert, "root-cert.pem": cert,
			"ca-key.pem": pemKey(t, testca.NewKey(t, testca.P256), "pkcs8")}, ca.ErrInvalidMaterial, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeDir(t, tt.files)
			_, err := keystore.LoadDir(dir, nil)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("LoadDir = %v, want %v", err, tt.wantErr)
			}
			if want := "ca-dir " + dir + ": " + tt.wantMsg; tt.wantMsg != "" && err.Error() != want {
				t.Errorf("error = %q, want %q", err, want)
			}
		})
	}
	t.Run("not PEM", func(t *testing.T) {
		dir := writeDir(t, map[string][]byte{"ca-cert.pem": []byte("junk"), "ca-key.pem": key, "root-cert.pem": cert})
		if _, err := keystore.LoadDir(dir, nil); err == nil {
			t.Fatal("LoadDir accepted a junk certificate file")
		}
	})
}

func writeDir(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func pemCerts(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// pemKey encodes key as PKCS#1 ("RSA PRIVATE KEY"), SEC1 ("EC PRIVATE
// KEY", optionally after openssl's "EC PARAMETERS") or PKCS#8.
func pemKey(t *testing.T, key crypto.Signer, format string) []byte {
	t.Helper()
	var (
		block pem.Block
		err   error
	)
	switch format {
	case "pkcs1":
		block = pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key.(*rsa.PrivateKey))}
	case "sec1", "ecparams+sec1":
		block.Type = "EC PRIVATE KEY"
		block.Bytes, err = x509.MarshalECPrivateKey(key.(*ecdsa.PrivateKey))
	default:
		block.Type = "PRIVATE KEY"
		block.Bytes, err = x509.MarshalPKCS8PrivateKey(key)
	}
	if err != nil {
		t.Fatal(err)
	}
	out := pem.EncodeToMemory(&block)
	if format == "ecparams+sec1" {
		prime256v1 := []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
		out = append(pem.EncodeToMemory(&pem.Block{Type: "EC PARAMETERS", Bytes: prime256v1}), out...)
	}
	return out
}

func sameCerts(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

// TestLoadDirSecretVolume reads a directory laid out like a mounted
// Kubernetes Secret: each file a symlink through "..data" to a timestamped
// directory.
func TestLoadDirSecretVolume(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	dir := t.TempDir()
	target := filepath.Join(dir, "..2026_01_01_00_00_00.000000001")
	files := map[string][]byte{"tls.crt": pemCerts(root.Cert), "tls.key": pemKey(t, root.Key, "pkcs8"), "ca.crt": pemCerts(root.Cert)}
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(target), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(target, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := keystore.LoadDir(dir, nil)
	if err != nil {
		t.Fatalf("LoadDir: %v", err)
	}
	if !m.Cert.Equal(root.Cert) {
		t.Error("loaded the wrong certificate")
	}
}

func TestLoadDirMissingDirectory(t *testing.T) {
	_, err := keystore.LoadDir(filepath.Join(t.TempDir(), "absent"), nil)
	if !errors.Is(err, keystore.ErrNoMaterial) {
		t.Fatalf("LoadDir = %v, want ErrNoMaterial", err)
	}
}
