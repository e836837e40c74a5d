package trustbundle

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestBundleContent(t *testing.T) {
	now := time.Now()
	older := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-48*time.Hour), now.Add(time.Hour))).Cert
	newer := testca.NewRoot(t, testca.P256).Cert
	issuer := testca.NewRoot(t, testca.P256)
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "leaf"},
		NotBefore: now, NotAfter: now.Add(time.Hour), BasicConstraintsValid: true}
	leaf := testca.Sign(t, leafTmpl, issuer.Cert, testca.NewKey(t, testca.P256).Public(), issuer.Key)

	tests := []struct {
		name    string
		roots   []*x509.Certificate
		want    []*x509.Certificate
		wantErr string
	}{
		{name: "one root", roots: []*x509.Certificate{newer}, want: []*x509.Certificate{newer}},
		{name: "ordered by NotBefore", roots: []*x509.Certificate{newer, older}, want: []*x509.Certificate{older, newer}},
		{name: "duplicates and nils dropped", roots: []*x509.Certificate{newer, nil, older, newer, older},
			want: []*x509.Certificate{older, newer}},
		{name: "empty", roots: nil, wantErr: "no roots"},
		{name: "only nil", roots: []*x509.Certificate{nil}, wantErr: "no roots"},
		{name: "not a CA", roots: []*x509.Certificate{newer, leaf}, wantErr: `root "CN=leaf" is not a CA certificate`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := bundleContent(tc.roots)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrInvalidRoots) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want ErrInvalidRoots containing %q", err, tc.wantErr)
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

// checkPEM checks that content is exactly want, PEM-encoded without headers.
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
}

func TestBundleContentTooLarge(t *testing.T) {
	root := testca.NewRoot(t, testca.P256).Cert
	// Many copies of one root are deduplicated, so fake size with big
	// distinct certificates: each copy differs in its raw bytes only.
	var roots []*x509.Certificate
	for i := 0; len(roots)*len(root.Raw)*4/3 <= maxBundleSize; i++ {
		c := *root
		c.Raw = append([]byte{byte(i), byte(i >> 8)}, root.Raw...)
		roots = append(roots, &c)
	}
	if _, err := bundleContent(roots); !errors.Is(err, ErrInvalidRoots) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("error = %v, want ErrInvalidRoots over the limit", err)
	}
}

func TestTargetName(t *testing.T) {
	content := mustContent(t, newRoots(t, 1)...)
	got := target{signer: "example.com/a.b"}.name(content)
	if !regexp.MustCompile(`^example\.com:a\.b:[0-9a-f]{16}$`).MatchString(got) {
		t.Errorf("name = %q, want example.com:a.b:<16 hex digits>", got)
	}
	if again := (target{signer: "example.com/a.b"}).name(content); again != got {
		t.Errorf("name not stable: %q then %q", got, again)
	}
	if other := (target{signer: "example.com/a.b"}).name(content + " "); other == got {
		t.Errorf("different content, same name %q", got)
	}
	if fixed := (target{signer: IstioSignerName, fixedName: IstioBundleName}).name(content); fixed != IstioBundleName {
		t.Errorf("fixed name = %q", fixed)
	}
}

func TestValidateSignerName(t *testing.T) {
	for _, tc := range []struct {
		signer string
		ok     bool
	}{
		{"workload-ca.io/spiffe", true},
		{"example.com/ns.name", true},
		{"example.com", false},
		{"example.com/a/b", false},
		{"localhost/x", false},
		{"Example.com/x", false},
		{"example.com/", false},
		{"example.com/UPPER", false},
	} {
		if err := validateSignerName(tc.signer); (err == nil) != tc.ok {
			t.Errorf("validateSignerName(%q) = %v, want ok=%v", tc.signer, err, tc.ok)
		}
	}
}

func TestNew(t *testing.T) {
	client := fake.NewClientset()
	roots := func() []*x509.Certificate { return nil }
	long := spiffeid.RequireTrustDomainFromString(strings.Repeat("a", 64) + ".org")
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"defaults", Config{Client: client, TrustDomain: testTD, Roots: roots}, ""},
		{"no client", Config{TrustDomain: testTD, Roots: roots}, "missing Client"},
		{"no roots", Config{Client: client, TrustDomain: testTD}, "missing Roots"},
		{"no trust domain", Config{Client: client, Roots: roots}, "missing TrustDomain"},
		{"trust domain too long for a label", Config{Client: client, TrustDomain: long, Roots: roots}, "label value"},
		{"bad signer", Config{Client: client, TrustDomain: testTD, Roots: roots, SignerName: "nope"}, "signer name"},
		{"istio signer", Config{Client: client, TrustDomain: testTD, Roots: roots, SignerName: IstioSignerName}, "IstioCompatible"},
		{"negative resync", Config{Client: client, TrustDomain: testTD, Roots: roots, ResyncPeriod: -1}, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.cfg)
			if tc.wantErr == "" {
				if err != nil || p.resync != DefaultResyncPeriod || p.signers()[0] != DefaultSignerName {
					t.Fatalf("New = %v; want defaults", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("New error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
