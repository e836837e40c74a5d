package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/internal/inspect"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestInspectCommand(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P256)
	chain := testca.WritePEM(t, testca.NewLeaf(t, mid, "spiffe://cluster.local/ns/demo/sa/web", time.Now().Add(time.Hour)), mid.Cert)
	bundle := testca.WritePEM(t, root.Cert)
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		inStdout []string
		inStderr string
	}{
		{"a chain and a bundle, as text", []string{"inspect", chain, bundle}, 0,
			[]string{"#0 leaf         spiffe://cluster.local/ns/demo/sa/web", "signed by #1; does not verify: no root of this source signs it", "#0 root"}, ""},
		{"nothing to inspect", []string{"inspect"}, 2, nil, "nothing to inspect"},
		{"both bundle selectors", []string{"inspect", "--cluster-trust-bundle", "a", "--signer", "b"}, 2, nil, "exclusive"},
		{"an unknown output", []string{"inspect", "--output", "yaml", bundle}, 2, nil, "--output"},
		{"a file that holds no certificate", []string{"inspect", garbage}, 1, nil, garbage},
		{"a file that is not there", []string{"inspect", filepath.Join(t.TempDir(), "missing.pem")}, 1, nil, "missing.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), tc.args, &stdout, &stderr); code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, tc.code, stderr.String())
			}
			for _, s := range tc.inStdout {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout.String())
				}
			}
			if !strings.Contains(stderr.String(), tc.inStderr) {
				t.Errorf("stderr lacks %q:\n%s", tc.inStderr, stderr.String())
			}
		})
	}
	t.Run("json", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), []string{"inspect", "--output", "json", bundle}, &stdout, &stderr); code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		var out []inspect.Cert
		if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || len(out) != 1 || out[0].Role != "root" || out[0].Key != "ECDSA P-256" {
			t.Fatalf("json %s: %v", stdout.String(), err)
		}
	})
}
