package clustertrustbundle

import (
	"crypto/x509"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/trust"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

// Bundle content is the roots' canonical PEM (see package rootset), and
// roots that cannot be published wrap ErrInvalidRoots.
func TestBundleContent(t *testing.T) {
	older := testca.NewRoot(t, testca.P256, testca.Validity(time.Now().Add(-48*time.Hour), time.Now().Add(time.Hour))).Cert
	newer := testca.NewRoot(t, testca.P256).Cert
	got, err := bundleContent([]*x509.Certificate{newer, older, newer})
	if err != nil {
		t.Fatal(err)
	}
	want, err := rootset.PEM([]*x509.Certificate{older, newer})
	if err != nil || got != want {
		t.Errorf("content is not the canonical PEM of the roots (%v)", err)
	}
	if _, err := bundleContent(nil); !errors.Is(err, ErrInvalidRoots) {
		t.Errorf("no roots: error = %v, want ErrInvalidRoots", err)
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
	content := mustContent(t, testca.RootCerts(t, 1)...)
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
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"defaults", Config{Client: client, Options: trust.Options{TrustDomain: testTD, Roots: roots}}, ""},
		{"no client", Config{Options: trust.Options{TrustDomain: testTD, Roots: roots}}, "missing Client"},
		{"bad signer", Config{Client: client, SignerName: "nope", Options: trust.Options{TrustDomain: testTD, Roots: roots}}, "signer name"},
		{"istio signer", Config{Client: client, SignerName: IstioSignerName, Options: trust.Options{TrustDomain: testTD, Roots: roots}}, "IstioCompatible"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.cfg)
			if tc.wantErr == "" {
				if err != nil || p.opts.ResyncPeriod != trust.DefaultResyncPeriod || p.signers()[0] != DefaultSignerName {
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
