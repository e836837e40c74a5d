package istiodcert

import (
	"crypto/x509"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestAssess(t *testing.T) {
	now := time.Now()
	clk := testclock.NewFakeClock(now)
	signing := testca.NewRoot(t, testca.P256)
	other := testca.NewRoot(t, testca.P256)
	authority := newAuthority(t, clk, signing)
	names := []string{"istiod.istio-system.svc", "istiod-canary.istio-system.svc"}
	roots := rootsPEM(t, []*x509.Certificate{signing.Cert})
	good := func(t *testing.T) *corev1.Secret {
		key, err := newKey()
		if err != nil {
			t.Fatal(err)
		}
		leaf, above, err := authority.IssueServing(t.Context(), key.Public(), names, 3*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		is, err := secretData(leaf, above, key, roots)
		if err != nil {
			t.Fatal(err)
		}
		return &corev1.Secret{Data: is.data}
	}
	for _, tc := range []struct {
		name string
		edit func(*corev1.Secret) *corev1.Secret
		// names, signing certificate and time assess is asked about.
		names   []string
		signing *x509.Certificate
		at      time.Duration
		want    string
	}{
		{name: "fresh", want: ""},
		{name: "names in another order", names: []string{names[1], names[0]}, want: ""},
		{name: "an hour before two thirds", at: time.Hour, want: ""},
		{name: "no Secret", edit: func(*corev1.Secret) *corev1.Secret { return nil }, want: reasonMissing},
		{name: "no key", edit: func(s *corev1.Secret) *corev1.Secret { delete(s.Data, KeyKey); return s }, want: reasonUnusable},
		{name: "another key", edit: func(s *corev1.Secret) *corev1.Secret { s.Data[KeyKey] = other.KeyPEM(t); return s }, want: reasonUnusable},
		{name: "garbage certificate", edit: func(s *corev1.Secret) *corev1.Secret { s.Data[CertKey] = []byte("x"); return s }, want: reasonUnusable},
		{name: "a name fewer", names: names[:1], want: reasonNames},
		{name: "signed by another CA", signing: other.Cert, want: reasonSigner},
		{name: "two thirds passed", at: 2*time.Hour + time.Minute, want: reasonDue},
		{name: "expired", at: 4 * time.Hour, want: reasonNotServed},
		{name: "not yet valid", at: -2 * time.Hour, want: reasonNotServed},
		{name: "other roots", edit: func(s *corev1.Secret) *corev1.Secret {
			s.Data[RootsKey] = []byte(rootsPEM(t, []*x509.Certificate{signing.Cert, other.Cert}))
			return s
		}, want: reasonRoots},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good(t)
			if tc.edit != nil {
				s = &corev1.Secret{Data: maps.Clone(s.Data)}
				s = tc.edit(s)
			}
			n, sc := names, signing.Cert
			if tc.names != nil {
				n = tc.names
			}
			if tc.signing != nil {
				sc = tc.signing
			}
			v := assess(s, n, sc, roots, now.Add(tc.at))
			if v.reissue != tc.want {
				t.Fatalf("assess = %q, want %q", v.reissue, tc.want)
			}
			if tc.want == "" && (v.renewAt.IsZero() || !v.renewAt.Before(v.notAfter)) {
				t.Fatalf("renewAt %v, notAfter %v", v.renewAt, v.notAfter)
			}
		})
	}
}
