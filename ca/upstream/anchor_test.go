package upstream_test

import (
	"crypto/x509"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/ca/upstream"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// TestPinnedTrustAnchor: with pinned anchors, an
// answer is taken only if its chain leads to one of them, and the anchor
// the CA publishes is the pinned certificate, never the last one the
// answer carries (cert-manager's status.ca, which whoever can edit the
// issuer or the request's status decides).
func TestPinnedTrustAnchor(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	company := testca.NewIntermediate(t, root, testca.P256)
	evil := testca.NewRoot(t, testca.P256)
	evilMid := testca.NewIntermediate(t, evil, testca.P256)
	key := testca.NewKey(t, testca.P256)
	now := time.Now()
	issue := func(by *testca.CA) *x509.Certificate {
		return testca.Sign(t, &x509.Certificate{SerialNumber: big.NewInt(7), URIs: []*url.URL{td.ID().URL()},
			NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), BasicConstraintsValid: true, IsCA: true,
			MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign}, by.Cert, key.Public(), by.Key)
	}
	tests := []struct {
		name              string
		pins              []*testca.CA
		issued            upstream.Issued
		wantAnchor        *testca.CA
		wantIntermediates int
		wantErr           string
	}{
		{name: "chain ends at the pinned root", pins: []*testca.CA{root},
			issued: upstream.Issued{Cert: issue(company), Chain: testca.Certs(company, root)}, wantAnchor: root, wantIntermediates: 1},
		{name: "no status.ca: the pinned root that issued the chain's top is the anchor", pins: []*testca.CA{root},
			issued: upstream.Issued{Cert: issue(company), Chain: testca.Certs(company)}, wantAnchor: root, wantIntermediates: 1},
		{name: "no chain at all, issued by the pinned root", pins: []*testca.CA{root},
			issued: upstream.Issued{Cert: issue(root)}, wantAnchor: root},
		{name: "pinned company intermediate: the chain is cut there", pins: []*testca.CA{company},
			issued: upstream.Issued{Cert: issue(company), Chain: testca.Certs(company, root)}, wantAnchor: company},
		{name: "one of two pins", pins: []*testca.CA{evilMid, root},
			issued: upstream.Issued{Cert: issue(root), Chain: testca.Certs(root)}, wantAnchor: root},
		{name: "a root the editor of status.ca holds is refused", pins: []*testca.CA{root},
			issued: upstream.Issued{Cert: issue(evil), Chain: testca.Certs(evil)}, wantErr: "none of the 1 pinned trust anchors"},
		{name: "an issuer under another root is refused", pins: []*testca.CA{root},
			issued: upstream.Issued{Cert: issue(evilMid), Chain: testca.Certs(evilMid, evil)}, wantErr: "none of the 1 pinned"},
		{name: "status.ca naming the pinned root above a foreign issuer is refused", pins: []*testca.CA{root},
			issued: upstream.Issued{Cert: issue(evilMid), Chain: testca.Certs(evilMid, root)}, wantErr: "did not issue"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := upstream.Check(tt.issued, key, upstream.CheckOptions{TrustDomain: td, Now: now, TrustAnchors: testca.Certs(tt.pins...)})
			if tt.wantErr != "" {
				if !errors.Is(err, upstream.ErrUpstream) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Check = %v, want ErrUpstream containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Roots) != 1 || !m.Roots[0].Equal(tt.wantAnchor.Cert) || len(m.Intermediates) != tt.wantIntermediates {
				t.Fatalf("anchor %s and %d intermediates, want %s and %d", m.Roots[0].Subject, len(m.Intermediates),
					tt.wantAnchor.Cert.Subject, tt.wantIntermediates)
			}
		})
	}
}

// TestUpstreamAnchorChange: a successor under an
// anchor the CA does not trust yet is adopted only when that anchor is
// pinned or a change is explicitly allowed; otherwise the answer is
// refused (ErrAnchorChange, counted as a failed attempt) and the current
// intermediate stays. The first anchor is adopted and then pinned by the
// CA's state.
func TestUpstreamAnchorChange(t *testing.T) {
	root, moved := testca.NewRoot(t, testca.P256), testca.NewRoot(t, testca.P256)
	tests := []struct {
		name    string
		current []*testca.CA // the anchors of the CA's state
		pins    []*testca.CA
		allow   bool
		issuer  *testca.CA
		wantErr bool
	}{
		{name: "first intermediate: its anchor is adopted", issuer: root},
		{name: "same anchor as the state's", current: []*testca.CA{root}, issuer: root},
		{name: "moved to a new anchor: refused", current: []*testca.CA{root}, issuer: moved, wantErr: true},
		{name: "an anchor the state still holds (a retiring intermediate's)", current: []*testca.CA{root, moved}, issuer: root},
		{name: "moved, change allowed", current: []*testca.CA{root}, allow: true, issuer: moved},
		{name: "moved to a pinned anchor", current: []*testca.CA{root}, pins: []*testca.CA{root, moved}, issuer: moved},
		{name: "moved to an anchor that is not pinned", current: []*testca.CA{root}, pins: []*testca.CA{root}, allow: true, issuer: moved,
			wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obs := &observed{}
			minter, err := upstream.New(upstream.Config{Authority: &fakeUpstream{t: t, issuer: tt.issuer}, TrustDomain: td,
				Lifetime: 24 * time.Hour, Observer: obs, TrustAnchors: testca.Certs(tt.pins...), AllowAnchorChange: tt.allow,
				Current: func() []*x509.Certificate { return testca.Certs(tt.current...) }})
			if err != nil {
				t.Fatal(err)
			}
			m, err := minter.Generate(t.Context(), time.Now())
			if tt.wantErr {
				if !errors.Is(err, upstream.ErrUpstream) || (len(tt.pins) == 0 && !errors.Is(err, upstream.ErrAnchorChange)) {
					t.Fatalf("Generate = %v, want the answer refused", err)
				}
				if len(obs.errs) != 1 || obs.errs[0] == nil {
					t.Fatalf("observer told %v, want one refused attempt", obs.errs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !m.Roots[0].Equal(tt.issuer.Cert) {
				t.Fatalf("anchor %s, want %s", m.Roots[0].Subject, tt.issuer.Cert.Subject)
			}
		})
	}
}
