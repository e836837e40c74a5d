package federation

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/workload-ca/workload-ca/internal/testca"
)

// nonCA is a self-signed certificate of an end entity.
func nonCA(t testing.TB) *x509.Certificate {
	key := testca.NewKey(t, testca.P256)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "not a CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}
	return testca.Sign(t, tmpl, tmpl, key.Public(), key)
}

// TestCheckBundle: what of a peer's bundle is taken, and why the rest is
// refused, for each hostile bundle of the federation finding.
func TestCheckBundle(t *testing.T) {
	now := time.Now()
	ourRoot := testca.NewRoot(t, testca.P256)
	good, next := testca.NewRoot(t, testca.P256).Cert, testca.NewRoot(t, testca.P256).Cert
	expired := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-2*time.Hour), now.Add(-time.Hour))).Cert
	noCertSign := testca.NewRoot(t, testca.P256, func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature }).Cert
	caFlagOff := testca.NewRoot(t, testca.P256, func(c *x509.Certificate) { c.IsCA = false }).Cert
	// Our root's key under another certificate the peer made up.
	ourKeyElsewhere := testca.Sign(t, &x509.Certificate{SerialNumber: big.NewInt(9), Subject: pkix.Name{CommonName: "ours, re-signed"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), BasicConstraintsValid: true, IsCA: true,
		KeyUsage: x509.KeyUsageCertSign}, ourRoot.Cert, ourRoot.Key.Public(), ourRoot.Key)
	// Self-issued (subject = issuer) but signed by another key.
	forger := testca.NewKey(t, testca.P256)
	forgedTmpl := &x509.Certificate{SerialNumber: big.NewInt(11), Subject: pkix.Name{CommonName: "self-issued"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), BasicConstraintsValid: true, IsCA: true, KeyUsage: x509.KeyUsageCertSign}
	forged := testca.Sign(t, forgedTmpl, &x509.Certificate{Subject: forgedTmpl.Subject}, testca.NewKey(t, testca.P256).Public(), forger)
	many := testca.RootCerts(t, DefaultMaxRoots+1)

	for name, tc := range map[string]struct {
		roots   []*x509.Certificate
		jwt     bool
		want    []*x509.Certificate // nil: refused
		wantErr string
	}{
		"one root":                                 {roots: []*x509.Certificate{good}, want: []*x509.Certificate{good}},
		"two roots during a rotation":              {roots: []*x509.Certificate{good, next}, want: []*x509.Certificate{good, next}},
		"an expired root is dropped":               {roots: []*x509.Certificate{expired, good}, want: []*x509.Certificate{good}},
		"JWT authorities are dropped":              {roots: []*x509.Certificate{good}, jwt: true, want: []*x509.Certificate{good}},
		"only expired roots":                       {roots: []*x509.Certificate{expired}, wantErr: "every X.509 authority has expired"},
		"no roots":                                 {wantErr: "no X.509 authorities"},
		"too many roots":                           {roots: many, wantErr: "17 X.509 authorities, at most 16"},
		"a non-CA certificate":                     {roots: []*x509.Certificate{good, nonCA(t)}, wantErr: "not a CA certificate"},
		"a CA flag off":                            {roots: []*x509.Certificate{caFlagOff}, wantErr: "not a CA certificate"},
		"a CA without keyCertSign":                 {roots: []*x509.Certificate{noCertSign}, wantErr: "no keyCertSign"},
		"our own root":                             {roots: []*x509.Certificate{good, ourRoot.Cert}, wantErr: "one of our own roots"},
		"our own root's key, re-signed":            {roots: []*x509.Certificate{ourKeyElsewhere}, wantErr: "one of our own roots"},
		"a self-issued root signed by another key": {roots: []*x509.Certificate{forged}, wantErr: "signature does not verify"},
	} {
		t.Run(name, func(t *testing.T) {
			b := spiffebundle.FromX509Authorities(theirs, tc.roots)
			b.SetRefreshHint(time.Minute)
			b.SetSequenceNumber(3)
			if tc.jwt {
				if err := b.AddJWTAuthority("k", testca.NewKey(t, testca.P256).Public()); err != nil {
					t.Fatal(err)
				}
			}
			got, err := CheckBundle(b, now, DefaultMaxRoots, []*x509.Certificate{ourRoot.Cert})
			if tc.want == nil {
				if !errors.Is(err, ErrBundleRefused) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("CheckBundle: %v, want a refusal with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("CheckBundle: %v", err)
			}
			if !spiffebundle.FromX509Authorities(theirs, tc.want).X509Bundle().Equal(got.X509Bundle()) {
				t.Errorf("kept %d roots, want %d", len(got.X509Authorities()), len(tc.want))
			}
			hint, _ := got.RefreshHint()
			seq, _ := got.SequenceNumber()
			if hint != time.Minute || seq != 3 || len(got.JWTAuthorities()) != 0 {
				t.Errorf("refresh hint %v, sequence %d, %d JWT authorities; want 1m, 3, none", hint, seq, len(got.JWTAuthorities()))
			}
		})
	}
}

// TestParseBundleRefusesWhatIsNotJSON: an HTML error page or an empty body
// is named as such.
func TestParseBundleRefusesWhatIsNotJSON(t *testing.T) {
	for name, body := range map[string]string{
		"html":        "<html><body>503</body></html>",
		"empty":       "",
		"json array":  `[{"keys":[]}]`,
		"a bare word": "null",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseBundle(theirs, []byte(body)); !errors.Is(err, ErrBundleRefused) || !strings.Contains(err.Error(), "not a JSON object") {
				t.Errorf("ParseBundle: %v, want a refusal naming a body that is not a JSON object", err)
			}
		})
	}
}

// FuzzCheckBundle: whatever a peer serves, a bundle that passes holds 1
// to maxRoots unexpired CA roots with keyCertSign, none of them ours.
func FuzzCheckBundle(f *testing.F) {
	now := time.Now()
	own := testca.NewRoot(f, testca.P256).Cert
	seed := func(certs ...*x509.Certificate) {
		b := spiffebundle.FromX509Authorities(theirs, certs)
		b.SetRefreshHint(time.Minute)
		raw, err := b.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	seed(testca.NewRoot(f, testca.P256).Cert)
	seed(testca.RootCerts(f, 5)...)
	seed(nonCA(f))
	seed(own)
	f.Add([]byte(`{"keys":[]}`))
	f.Add([]byte(`{"keys":[{"kty":"EC","use":"x509-svid","x5c":["AAAA"]}]}`))
	f.Add([]byte("<html>"))
	const maxRoots = 4
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := ParseBundle(theirs, raw)
		if err != nil {
			return
		}
		got, err := CheckBundle(b, now, maxRoots, []*x509.Certificate{own})
		if err != nil {
			return
		}
		roots := got.X509Authorities()
		if len(roots) == 0 || len(roots) > maxRoots || len(got.JWTAuthorities()) != 0 {
			t.Fatalf("passed with %d roots and %d JWT authorities", len(roots), len(got.JWTAuthorities()))
		}
		for _, c := range roots {
			if !c.IsCA || !c.BasicConstraintsValid || c.KeyUsage&x509.KeyUsageCertSign == 0 || now.After(c.NotAfter) || c.Equal(own) {
				t.Fatalf("passed a root that is not a usable CA or is ours: %s", describe(c))
			}
		}
	})
}
