package rootset

import (
	"crypto/x509"
	"errors"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/internal/testca"
)

var (
	tdA = spiffeid.RequireTrustDomainFromString("a.example")
	tdB = spiffeid.RequireTrustDomainFromString("b.example")
)

// TestComposeBadPeerLeavesOursAndOthers: a peer
// serving a non-CA certificate, or roots over the size budget, is left out
// on its own; our roots and the other peers' still go in. Before, any bad
// peer root made the whole set fail, and our own next root was never
// published.
func TestComposeBadPeerLeavesOursAndOthers(t *testing.T) {
	now := time.Now()
	ours := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-3*time.Hour), now.Add(time.Hour))).Cert
	oursNext := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-2*time.Hour), now.Add(time.Hour))).Cert
	peerA := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(time.Hour))).Cert
	// Roots are ordered by NotBefore (then DER): each starts in another
	// second, so the order the tests want is the only one.
	peerB := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-30*time.Minute), now.Add(time.Hour))).Cert
	issuer := testca.NewRoot(t, testca.P256)
	leaf := testca.Sign(t, &x509.Certificate{SerialNumber: big.NewInt(7), NotBefore: now, NotAfter: now.Add(time.Hour),
		BasicConstraintsValid: true}, issuer.Cert, testca.NewKey(t, testca.P256).Public(), issuer.Key)
	noCertSign := testca.NewRoot(t, testca.P256, func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature }).Cert
	budget := len(mustPEM(t, ours, oursNext, peerA)) // room for one peer root beside ours

	tests := []struct {
		name     string
		peers    []Peer
		want     []*x509.Certificate
		leftOut  map[spiffeid.TrustDomain]string // reason by trust domain
		noBudget bool
	}{
		{name: "good peers: all in", noBudget: true,
			peers: []Peer{{tdA, []*x509.Certificate{peerA}}, {tdB, []*x509.Certificate{peerB}}},
			want:  []*x509.Certificate{ours, oursNext, peerA, peerB}},
		{name: "a peer with a non-CA certificate: that peer out, the other in", noBudget: true,
			peers:   []Peer{{tdA, []*x509.Certificate{peerA, leaf}}, {tdB, []*x509.Certificate{peerB}}},
			want:    []*x509.Certificate{ours, oursNext, peerB},
			leftOut: map[spiffeid.TrustDomain]string{tdA: ReasonInvalid}},
		{name: "a peer root that may not sign certificates: out", noBudget: true,
			peers:   []Peer{{tdA, []*x509.Certificate{noCertSign}}},
			want:    []*x509.Certificate{ours, oursNext},
			leftOut: map[spiffeid.TrustDomain]string{tdA: ReasonInvalid}},
		{name: "the peer that would pass the budget: out, the first in",
			peers:   []Peer{{tdA, []*x509.Certificate{peerA}}, {tdB, []*x509.Certificate{peerB}}},
			want:    []*x509.Certificate{ours, oursNext, peerA},
			leftOut: map[spiffeid.TrustDomain]string{tdB: ReasonOverBudget}},
		{name: "a peer over the budget alone: out before encoding, the next in",
			peers:   []Peer{{tdB, slices.Repeat([]*x509.Certificate{peerB}, budget/len(peerB.Raw)+1)}, {tdA, []*x509.Certificate{peerA}}},
			want:    []*x509.Certificate{ours, oursNext, peerA},
			leftOut: map[spiffeid.TrustDomain]string{tdB: ReasonOverBudget}},
		{name: "a peer serving our own roots: in, no duplicate", noBudget: true,
			peers: []Peer{{tdA, []*x509.Certificate{oursNext, ours}}},
			want:  []*x509.Certificate{ours, oursNext}},
		{name: "a peer with no bundle yet: neither in nor reported", noBudget: true,
			peers: []Peer{{tdA, nil}, {tdB, []*x509.Certificate{nil}}},
			want:  []*x509.Certificate{ours, oursNext}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Composition{Budget: budget}
			if tc.noBudget {
				c.Budget = 0
			}
			got, left, err := c.Compose([]*x509.Certificate{ours, oursNext}, tc.peers)
			if err != nil {
				t.Fatal(err)
			}
			checkPEM(t, got, tc.want)
			gotLeft := map[spiffeid.TrustDomain]string{}
			for _, l := range left {
				gotLeft[l.TrustDomain] = l.Reason
				if l.Err == nil || !errors.Is(l.Err, ErrInvalid) {
					t.Errorf("%s left out for %v, want an error wrapping ErrInvalid", l.TrustDomain, l.Err)
				}
			}
			if len(gotLeft) != len(tc.leftOut) {
				t.Fatalf("left out %v, want %v", gotLeft, tc.leftOut)
			}
			for td, r := range tc.leftOut {
				if gotLeft[td] != r {
					t.Fatalf("left out %v, want %v", gotLeft, tc.leftOut)
				}
			}
		})
	}
}

// TestComposeOwnRootsFail: our own roots are still checked as before;
// their fault is an error, whatever the peers hold.
func TestComposeOwnRootsFail(t *testing.T) {
	ours := testca.NewRoot(t, testca.P256).Cert
	peer := []Peer{{tdA, []*x509.Certificate{testca.NewRoot(t, testca.P256).Cert}}}
	tests := []struct {
		name   string
		c      Composition
		own    []*x509.Certificate
		substr string
	}{
		{"no roots of ours", Composition{}, nil, "no roots"},
		{"ours over the budget alone", Composition{Budget: 100}, []*x509.Certificate{ours}, "over the 100-byte limit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := tc.c.Compose(tc.own, peer)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("error = %v, want ErrInvalid containing %q", err, tc.substr)
			}
		})
	}
}

// TestComposeCheck: a destination's own check leaves a peer out with its
// reason.
func TestComposeCheck(t *testing.T) {
	ours := testca.NewRoot(t, testca.P256).Cert
	peerA, peerB := testca.NewRoot(t, testca.P256).Cert, testca.NewRoot(t, testca.P256).Cert
	c := Composition{Check: func(r *x509.Certificate) error {
		if r == peerA {
			return ErrDNSUnconstrained
		}
		return nil
	}}
	got, left, err := c.Compose([]*x509.Certificate{ours}, []Peer{{tdA, []*x509.Certificate{peerA}}, {tdB, []*x509.Certificate{peerB}}})
	if err != nil {
		t.Fatal(err)
	}
	checkPEM(t, got, mustSorted(t, ours, peerB))
	if len(left) != 1 || left[0].TrustDomain != tdA || left[0].Reason != ReasonDNSUnconstrained {
		t.Fatalf("left out %+v, want %s for %s", left, tdA, ReasonDNSUnconstrained)
	}
}

func mustPEM(t testing.TB, roots ...*x509.Certificate) string {
	t.Helper()
	s, err := PEM(roots)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// mustSorted returns roots in PEM's order.
func mustSorted(t testing.TB, roots ...*x509.Certificate) []*x509.Certificate {
	t.Helper()
	out := slices.Clone(roots)
	slices.SortFunc(out, func(a, b *x509.Certificate) int {
		if c := a.NotBefore.Compare(b.NotBefore); c != 0 {
			return c
		}
		return strings.Compare(string(a.Raw), string(b.Raw))
	})
	return out
}
