package rootset

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestPEM(t *testing.T) {
	now := time.Now()
	older := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-48*time.Hour), now.Add(time.Hour))).Cert
	newer := testca.NewRoot(t, testca.P256).Cert
	issuer := testca.NewRoot(t, testca.P256)
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "leaf"},
		NotBefore: now, NotAfter: now.Add(time.Hour), BasicConstraintsValid: true}
	leaf := testca.Sign(t, leafTmpl, issuer.Cert, testca.NewKey(t, testca.P256).Public(), issuer.Key)
	sameTime := newer.NotBefore
	twinA := testca.NewRoot(t, testca.P256, testca.Validity(sameTime, sameTime.Add(time.Hour))).Cert
	twinB := testca.NewRoot(t, testca.P256, testca.Validity(sameTime, sameTime.Add(time.Hour))).Cert
	lo, hi := twinA, twinB
	if string(lo.Raw) > string(hi.Raw) {
		lo, hi = hi, lo
	}

	tests := []struct {
		name    string
		roots   []*x509.Certificate
		want    []*x509.Certificate
		wantErr string
	}{
		{name: "one root", roots: []*x509.Certificate{newer}, want: []*x509.Certificate{newer}},
		{name: "ordered by NotBefore", roots: []*x509.Certificate{newer, older}, want: []*x509.Certificate{older, newer}},
		{name: "same NotBefore: ordered by DER", roots: []*x509.Certificate{hi, lo}, want: []*x509.Certificate{lo, hi}},
		{name: "duplicates and nils dropped", roots: []*x509.Certificate{newer, nil, older, newer, older},
			want: []*x509.Certificate{older, newer}},
		{name: "empty", roots: nil, wantErr: "no roots"},
		{name: "only nil", roots: []*x509.Certificate{nil}, wantErr: "no roots"},
		{name: "not a CA", roots: []*x509.Certificate{newer, leaf}, wantErr: `root "CN=leaf" is not a CA certificate`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PEM(tc.roots)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want ErrInvalid containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkPEM(t, got, tc.want)
		})
	}
}

// checkPEM checks that content is exactly want, as CERTIFICATE blocks
// without headers, each ending with a newline.
func checkPEM(t testing.TB, content string, want []*x509.Certificate) {
	t.Helper()
	rest := []byte(content)
	for i, w := range want {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil || b.Type != "CERTIFICATE" || len(b.Headers) != 0 || string(b.Bytes) != string(w.Raw) {
			t.Fatalf("block %d is not certificate %q without headers", i, w.Subject)
		}
	}
	if len(rest) != 0 {
		t.Fatalf("%d bytes after the last expected certificate", len(rest))
	}
	if !strings.HasSuffix(content, "-----END CERTIFICATE-----\n") {
		t.Fatal("content does not end with a newline after the last block")
	}
	if n := strings.Count(content, "-----END CERTIFICATE-----\n"); n != len(want) {
		t.Fatalf("%d blocks end with a newline, want %d", n, len(want))
	}
}
