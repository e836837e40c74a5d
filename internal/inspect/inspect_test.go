package inspect

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestInspect(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P384)
	other := testca.NewRoot(t, testca.P256)
	id := "spiffe://cluster.local/ns/demo/sa/web"
	leaf := testca.NewLeaf(t, mid, id, time.Now().Add(time.Hour))
	expired := testca.NewLeaf(t, mid, id, time.Now().Add(-time.Minute))
	stranger := testca.NewLeaf(t, other, id, time.Now().Add(time.Hour))
	now := time.Now()
	ptr := func(i int) *int { return &i }
	for _, tc := range []struct {
		name  string
		certs []*x509.Certificate
		want  []Cert // the fields compared: Role, SPIFFEID, Validity, SignedBy, VerifiesTo, VerifyError
	}{
		{"a chain with its root", []*x509.Certificate{leaf, mid.Cert, root.Cert}, []Cert{
			{Role: "leaf", SPIFFEID: id, Validity: "valid", SignedBy: ptr(1), VerifiesTo: ptr(2)},
			{Role: "intermediate", Validity: "valid", SignedBy: ptr(2), VerifiesTo: ptr(2)},
			{Role: "root", Validity: "valid", SignedBy: ptr(2)},
		}},
		{"a chain without its root", []*x509.Certificate{leaf, mid.Cert}, []Cert{
			{Role: "leaf", SPIFFEID: id, Validity: "valid", SignedBy: ptr(1), VerifyError: "no root of this source signs it"},
			{Role: "intermediate", Validity: "valid", VerifyError: "no root of this source signs it"},
		}},
		{"a leaf of another CA beside a bundle", []*x509.Certificate{stranger, root.Cert}, []Cert{
			{Role: "leaf", SPIFFEID: id, Validity: "valid", VerifyError: "no root of this source signs it"},
			{Role: "root", Validity: "valid", SignedBy: ptr(1)},
		}},
		{"an expired leaf", []*x509.Certificate{expired, mid.Cert, root.Cert}, []Cert{
			{Role: "leaf", SPIFFEID: id, Validity: "expired", SignedBy: ptr(1), VerifyError: "x509: certificate has expired or is not yet valid"},
			{Role: "intermediate", Validity: "valid", SignedBy: ptr(2), VerifiesTo: ptr(2)},
			{Role: "root", Validity: "valid", SignedBy: ptr(2)},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Describe(Set{Source: "s", Certs: tc.certs}, now)
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
