package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func writeFiles(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestServeValidate: --validate checks the material a directory holds,
// says what serve would run, writes nothing and exits; no API server is
// needed (none is configured here).
func TestServeValidate(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P256)
	good := writeFiles(t, map[string][]byte{keystore.IstioCertFile: mid.CertPEM(), keystore.IstioKeyFile: mid.KeyPEM(t),
		keystore.IstioRootFile: root.CertPEM(), keystore.IstioChainFile: mid.CertPEM()})
	wrongKey := writeFiles(t, map[string][]byte{keystore.IstioCertFile: mid.CertPEM(), keystore.IstioKeyFile: root.KeyPEM(t),
		keystore.IstioRootFile: root.CertPEM()})
	rootDir := writeFiles(t, map[string][]byte{keystore.IstioRootFile: root.CertPEM(), keystore.IstioRootKeyFile: root.KeyPEM(t)})
	empty := t.TempDir()
	missing := filepath.Join(t.TempDir(), "ca")
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none")) // nothing to reach
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  []string // in stdout (code 0) or stderr
	}{
		{"a directory with an intermediate", []string{"--ca-dir", good}, 0, []string{"configuration valid", "signs with \"CN=testca intermediate", "1 roots"}},
		{"an empty directory", []string{"--ca-dir", empty}, 0, []string{"is empty: a self-signed ecdsa-p256 root would be generated there"}},
		{"a missing directory to create", []string{"--ca-dir", missing, "--ca-dir-create", "--ca-key-type", "rsa-2048"}, 0, []string{"would be created with a self-signed rsa-2048 root"}},
		{"a key that is not the certificate's", []string{"--ca-dir", wrongKey}, 1, []string{"--ca-dir " + wrongKey}},
		{"a plug-in root", []string{"--ca-secret", "ns/state", "--ca-root-dir", rootDir}, 0, []string{"intermediates minted from root \"CN=testca root", "leader: rotation"}},
		{"a plug-in root directory without a key", []string{"--ca-secret", "ns/state", "--ca-root-dir", empty}, 1, []string{"--ca-root-dir"}},
		{"every leader task named", []string{"--ca-dir", empty, "--istio-root-configmap", "--istiod-cert", "--pod-certificates", "--istio-compatible"}, 0,
			[]string{"istio.io:istiod-ca:root-cert", "istio-ca-root-cert ConfigMap in every namespace", "Secret istio-system/istiod-tls for istiod.istio-system.svc", "PodCertificateRequests of signer"}},
		{"a bad flag is still a usage error", []string{"--ca-dir", empty, "--default-ttl", "5"}, 2, []string{"--default-ttl wants a duration"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"serve", "--validate"}, tc.args...), &stdout, &stderr)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout %s\nstderr %s", code, tc.code, stdout.String(), stderr.String())
			}
			got := stdout.String()
			if tc.code != 0 {
				got = stderr.String()
			}
			for _, s := range tc.out {
				if !strings.Contains(got, s) {
					t.Errorf("output lacks %q:\n%s", s, got)
				}
			}
		})
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Errorf("--validate wrote %d files into the empty directory", len(entries))
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("--validate created the missing directory: %v", err)
	}
}
