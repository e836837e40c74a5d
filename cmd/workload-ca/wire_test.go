package main

import (
	"context"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.step.sm/crypto/pemutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testlog"
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

// A panic in a gRPC handler that did not recover it itself (health, and
// any handler added later) answers Internal with nothing of the panic or
// the server's stack; the log has both.
func TestPanicInAHandlerAnswersInternal(t *testing.T) {
	var logs testlog.Buffer
	intercept := recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(recoverPanic(slog.New(slog.NewJSONHandler(&logs, nil)))))
	resp, err := intercept(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"},
		func(context.Context, any) (any, error) { panicInHandler(); return nil, nil })
	if resp != nil || status.Code(err) != codes.Internal || status.Convert(err).Message() != "internal error" {
		t.Fatalf("= %v, %v; want nil, Internal \"internal error\"", resp, err)
	}
	out := logs.String()
	if !strings.Contains(out, "handler exploded") || !strings.Contains(out, "panicInHandler") {
		t.Errorf("log has not the panic and its stack:\n%s", out)
	}
}

func panicInHandler() { panic("handler exploded") }
