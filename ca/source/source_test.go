package source

import (
	"context"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.step.sm/crypto/pemutil"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestGenerator(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	policy := rotation.DefaultPolicy()
	newSource := func(rootDir string) *Source {
		return &Source{cfg: Config{Authority: ca.Config{TrustDomain: td}, KeyType: keystore.KeyECDSAP256, RootDir: rootDir,
			Policy: policy, Now: time.Now}, log: slog.New(slog.DiscardHandler)}
	}

	t.Run("self-signed", func(t *testing.T) {
		a := newSource("")
		gen, err := a.generator()
		if err != nil {
			t.Fatal(err)
		}
		m, err := gen(context.Background(), time.Now())
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
		a := newSource(dir)
		gen, err := a.generator()
		if err != nil {
			t.Fatal(err)
		}
		if len(a.externalRoots()) != 2 || !a.externalRoots()[0].Equal(root.Cert) || !a.externalRoots()[1].Equal(other.Cert) {
			t.Fatalf("external roots = %d certificates, want both roots of the directory, signing root first", len(a.externalRoots()))
		}
		m, err := gen(context.Background(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		// testca roots live a year: the intermediate is cut at the root's expiry.
		if m.Cert.CheckSignatureFrom(root.Cert) != nil || !m.Cert.NotAfter.Equal(root.Cert.NotAfter) {
			t.Errorf("intermediate (not after %v) not issued by the plug-in root or not cut at its expiry %v", m.Cert.NotAfter, root.Cert.NotAfter)
		}
	})

	t.Run("missing root directory", func(t *testing.T) {
		if _, err := newSource(filepath.Join(t.TempDir(), "absent")).generator(); err == nil {
			t.Fatal("generator accepted a missing --ca-root-dir")
		}
	})
}

func TestOpen(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	authority := ca.Config{TrustDomain: td}
	secret := types.NamespacedName{Namespace: "istio-system", Name: "workload-ca"}
	type want struct {
		components []string // name, with "*" for the leader's
		ready      []string // the components with a readiness check
		phase      bool     // a rotation phase is reported
	}
	tests := []struct {
		name    string
		cfg     func(t *testing.T) Config
		want    want
		wantErr string
	}{
		{name: "directory: generated root, followed on every replica",
			cfg: func(t *testing.T) Config {
				return Config{Authority: authority, Dir: t.TempDir(), KeyType: keystore.KeyECDSAP256}
			},
			want: want{components: []string{"ca-dir"}}},
		{name: "Secret: followed on every replica, rotated by the leader",
			cfg: func(*testing.T) Config {
				return Config{Authority: authority, Secret: secret, Client: fake.NewClientset(), KeyType: keystore.KeyECDSAP256,
					Policy: rotation.DefaultPolicy()}
			},
			want: want{components: []string{"ca-secret", "*rotation"}, ready: []string{"ca-secret"}, phase: true}},
		{name: "neither", cfg: func(*testing.T) Config { return Config{Authority: authority} }, wantErr: "exactly one"},
		{name: "both",
			cfg:     func(t *testing.T) Config { return Config{Authority: authority, Dir: t.TempDir(), Secret: secret} },
			wantErr: "exactly one"},
		{name: "plug-in root without a Secret",
			cfg:     func(t *testing.T) Config { return Config{Authority: authority, Dir: t.TempDir(), RootDir: t.TempDir()} },
			wantErr: "requires a Secret"},
		{name: "plug-in root directory missing",
			cfg: func(t *testing.T) Config {
				return Config{Authority: authority, Secret: secret, Client: fake.NewClientset(), RootDir: filepath.Join(t.TempDir(), "absent"),
					KeyType: keystore.KeyECDSAP256, Policy: rotation.DefaultPolicy()}
			},
			wantErr: "absent"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg(t)
			cfg.Poll = time.Second
			s, err := Open(t.Context(), cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Open = %v; want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got want
			for _, c := range s.Components() {
				name := c.Name
				if c.Leader {
					name = "*" + name
				}
				got.components = append(got.components, name)
				if c.Ready != nil {
					got.ready = append(got.ready, c.Name)
				}
			}
			got.phase = s.Phase() != ""
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("components (-want +got):\n%s", diff)
			}
			if s.Authority() == nil || s.Authority().SigningCert() == nil {
				t.Fatal("no authority")
			}
		})
	}
}

// TestOnChange: whoever follows the material is told after it changed,
// and not when a change is refused.
func TestOnChange(t *testing.T) {
	s, err := Open(t.Context(), Config{Authority: ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local")},
		Dir: t.TempDir(), KeyType: keystore.KeyECDSAP256, Poll: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var told int
	s.OnChange(func() { told++ })
	next, err := keystore.GenerateRoot(keystore.GenerateOptions{KeyType: keystore.KeyECDSAP256,
		TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local")}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.setMaterial(next); err != nil || told != 1 || !s.Authority().SigningCert().Equal(next.Cert) {
		t.Fatalf("setMaterial = %v, told %d times; want the new root installed and one call", err, told)
	}
	if err := s.setMaterial(&ca.Material{}); err == nil || told != 1 {
		t.Fatalf("setMaterial of empty material = %v, told %d times; want refused and nobody told", err, told)
	}
}
