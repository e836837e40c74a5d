package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/internal/testca"
)

// leafOf issues a leaf for the SPIFFE ID uri under parent.
func leafOf(t *testing.T, parent *testca.CA, uri string, notAfter time.Time) *x509.Certificate {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	key := testca.NewKey(t, testca.P256)
	return testca.Sign(t, &x509.Certificate{SerialNumber: big.NewInt(7), URIs: []*url.URL{u},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter}, parent.Cert, key.Public(), parent.Key)
}

func TestInspect(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P384)
	other := testca.NewRoot(t, testca.P256)
	id := "spiffe://cluster.local/ns/demo/sa/web"
	leaf := leafOf(t, mid, id, time.Now().Add(time.Hour))
	expired := leafOf(t, mid, id, time.Now().Add(-time.Minute))
	stranger := leafOf(t, other, id, time.Now().Add(time.Hour))
	now := time.Now()
	ptr := func(i int) *int { return &i }
	for _, tc := range []struct {
		name  string
		certs []*x509.Certificate
		want  []inspected // the fields compared: Role, SPIFFEID, Validity, SignedBy, VerifiesTo, VerifyError
	}{
		{"a chain with its root", []*x509.Certificate{leaf, mid.Cert, root.Cert}, []inspected{
			{Role: "leaf", SPIFFEID: id, Validity: "valid", SignedBy: ptr(1), VerifiesTo: ptr(2)},
			{Role: "intermediate", Validity: "valid", SignedBy: ptr(2), VerifiesTo: ptr(2)},
			{Role: "root", Validity: "valid", SignedBy: ptr(2)},
		}},
		{"a chain without its root", []*x509.Certificate{leaf, mid.Cert}, []inspected{
			{Role: "leaf", SPIFFEID: id, Validity: "valid", SignedBy: ptr(1), VerifyError: "no root of this source signs it"},
			{Role: "intermediate", Validity: "valid", VerifyError: "no root of this source signs it"},
		}},
		{"a leaf of another CA beside a bundle", []*x509.Certificate{stranger, root.Cert}, []inspected{
			{Role: "leaf", SPIFFEID: id, Validity: "valid", VerifyError: "no root of this source signs it"},
			{Role: "root", Validity: "valid", SignedBy: ptr(1)},
		}},
		{"an expired leaf", []*x509.Certificate{expired, mid.Cert, root.Cert}, []inspected{
			{Role: "leaf", SPIFFEID: id, Validity: "expired", SignedBy: ptr(1), VerifyError: "x509: certificate has expired or is not yet valid"},
			{Role: "intermediate", Validity: "valid", SignedBy: ptr(2), VerifiesTo: ptr(2)},
			{Role: "root", Validity: "valid", SignedBy: ptr(2)},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := inspect(certSet{Source: "s", Certs: tc.certs}, now)
			if len(got) != len(tc.want) {
				t.Fatalf("%d described, want %d", len(got), len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if g.Role != w.Role || g.SPIFFEID != w.SPIFFEID || g.Validity != w.Validity || !sameIndex(g.SignedBy, w.SignedBy) ||
					!sameIndex(g.VerifiesTo, w.VerifiesTo) || !strings.HasPrefix(g.VerifyError, w.VerifyError) || (w.VerifyError == "") != (g.VerifyError == "") {
					t.Errorf("#%d: %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

func sameIndex(a, b *int) bool { return (a == nil && b == nil) || (a != nil && b != nil && *a == *b) }

func TestInspectCommand(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P256)
	chain := testca.WritePEM(t, leafOf(t, mid, "spiffe://cluster.local/ns/demo/sa/web", time.Now().Add(time.Hour)), mid.Cert)
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
		var out []inspected
		if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || len(out) != 1 || out[0].Role != "root" || out[0].Key != "ECDSA P-256" {
			t.Fatalf("json %s: %v", stdout.String(), err)
		}
	})
}
