package main

import (
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.step.sm/crypto/pemutil"

	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestCAGenerator(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	policy := rotation.DefaultPolicy()
	newApp := func(rootDir string) *app {
		return &app{cfg: serveConfig{TrustDomain: td, CAKeyType: keystore.KeyECDSAP256, CARootDir: rootDir}, log: slog.New(slog.DiscardHandler)}
	}

	t.Run("self-signed", func(t *testing.T) {
		a := newApp("")
		gen, err := a.caGenerator(policy)
		if err != nil {
			t.Fatal(err)
		}
		m, err := gen(time.Now())
		if err != nil || a.externalRoots() != nil || m.Cert.CheckSignatureFrom(m.Cert) != nil {
			t.Fatalf("want self-signed roots and no external roots: %v, %d roots", err, len(a.externalRoots()))
		}
	})

	t.Run("plug-in root", func(t *testing.T) {
		root, other := testca.NewRoot(t, testca.P256), testca.NewRoot(t, testca.P256)
		key, err := pemutil.Serialize(root.Key, pemutil.WithPKCS8(true))
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		write := func(name string, data []byte) {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		write(keystore.IstioRootFile, append(root.CertPEM(), other.CertPEM()...))
		write(keystore.IstioRootKeyFile, pem.EncodeToMemory(key))
		a := newApp(dir)
		gen, err := a.caGenerator(policy)
		if err != nil {
			t.Fatal(err)
		}
		if len(a.externalRoots()) != 2 || !a.externalRoots()[0].Equal(root.Cert) || !a.externalRoots()[1].Equal(other.Cert) {
			t.Fatalf("external roots = %d certificates, want both roots of the directory, signing root first", len(a.externalRoots()))
		}
		m, err := gen(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		// testca roots live a year: the intermediate is cut at the root's expiry.
		if m.Cert.CheckSignatureFrom(root.Cert) != nil || !m.Cert.NotAfter.Equal(root.Cert.NotAfter) {
			t.Errorf("intermediate (not after %v) not issued by the plug-in root or not cut at its expiry %v", m.Cert.NotAfter, root.Cert.NotAfter)
		}
	})

	t.Run("missing root directory", func(t *testing.T) {
		if _, err := newApp(filepath.Join(t.TempDir(), "absent")).caGenerator(policy); err == nil {
			t.Fatal("caGenerator accepted a missing --ca-root-dir")
		}
	})
}
