package keystore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.step.sm/crypto/keyutil"
	"go.step.sm/crypto/kms/uri"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// keyFile writes key as a PKCS#8 file outside any CA directory and returns
// its softkms URI.
func keyFile(t *testing.T, key *testca.CA) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "key.pem")
	if err := os.WriteFile(path, pemKey(t, key.Key, "pkcs8"), 0o600); err != nil {
		t.Fatal(err)
	}
	return "softkms:path=" + path
}

func openKey(t *testing.T, uri string) *keystore.Key {
	t.Helper()
	k, err := keystore.OpenKey(context.Background(), uri)
	if err != nil {
		t.Fatalf("OpenKey: %v", err)
	}
	t.Cleanup(func() { _ = k.Close() })
	return k
}

// The directory holds certificates only; the key comes from the KMS URI,
// for the CA's own material and for a plug-in root.
func TestLoadWithKeyFromURI(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	signing := testca.NewIntermediate(t, root, testca.P256)
	td := spiffeid.RequireTrustDomainFromString("example.org")

	t.Run("ca-dir, istio layout", func(t *testing.T) {
		dir := writeDir(t, map[string][]byte{"ca-cert.pem": pemCerts(signing.Cert), "root-cert.pem": pemCerts(root.Cert)})
		m, err := keystore.LoadDir(dir, openKey(t, keyFile(t, signing)))
		if err != nil {
			t.Fatalf("LoadDir: %v", err)
		}
		if !m.Cert.Equal(signing.Cert) {
			t.Fatalf("signing cert %s, want %s", m.Cert.Subject, signing.Cert.Subject)
		}
		issueAndVerify(t, td, m, time.Now())
	})
	t.Run("ca-dir, cert-manager layout", func(t *testing.T) {
		dir := writeDir(t, map[string][]byte{"tls.crt": pemCerts(signing.Cert), "ca.crt": pemCerts(root.Cert)})
		m, err := keystore.LoadDir(dir, openKey(t, keyFile(t, signing)))
		if err != nil {
			t.Fatalf("LoadDir: %v", err)
		}
		issueAndVerify(t, td, m, time.Now())
	})
	t.Run("ca-root-dir", func(t *testing.T) {
		dir := writeDir(t, map[string][]byte{"root-cert.pem": pemCerts(root.Cert)})
		r, err := keystore.LoadRootDir(dir, openKey(t, keyFile(t, root)))
		if err != nil {
			t.Fatalf("LoadRootDir: %v", err)
		}
		now := time.Now()
		m, err := keystore.GenerateIntermediate(r, keystore.GenerateOptions{TrustDomain: td, Lifetime: time.Hour}, now)
		if err != nil {
			t.Fatalf("GenerateIntermediate: %v", err)
		}
		issueThroughIntermediate(t, td, m, now)
	})
}

func TestLoadWithKeyFromURIRefuses(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	other := testca.NewRoot(t, testca.P256)
	tests := []struct {
		name    string
		files   map[string][]byte
		key     *testca.CA
		wantErr error
	}{
		{"key of another certificate", map[string][]byte{"ca-cert.pem": pemCerts(root.Cert), "root-cert.pem": pemCerts(root.Cert)},
			other, ca.ErrInvalidMaterial},
		{"key file beside the key URI", map[string][]byte{"ca-cert.pem": pemCerts(root.Cert), "root-cert.pem": pemCerts(root.Cert),
			"ca-key.pem": pemKey(t, root.Key, "pkcs8")}, root, keystore.ErrAmbiguousKey},
		{"no certificate", map[string][]byte{"root-cert.pem": pemCerts(root.Cert)}, root, keystore.ErrIncomplete},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := keystore.LoadDir(writeDir(t, tt.files), openKey(t, keyFile(t, tt.key)))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("LoadDir: %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestOpenKey(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	good := keyFile(t, root)
	k := openKey(t, good)
	if !keyutil.Equal(k.Public(), root.Key.Public()) {
		t.Fatal("the key from the URI is not the key in the file")
	}
	if k.URI != good {
		t.Fatalf("URI %q, want %q (nothing secret in it)", k.URI, good)
	}

	tests := []struct {
		name    string
		uri     string
		wantMsg string // in the error
	}{
		{"not a URI", "/etc/ca/key.pem", "not a KMS URI"},
		{"unknown KMS type", "nosuchkms:key=1", "nosuchkms"},
		{"missing key file", "softkms:path=" + filepath.Join(t.TempDir(), "absent.pem"), "absent.pem"},
		{"pin prompt", "pkcs11:token=ca;id=01?pin-prompt", "pin-source"},
		{"secret in a failing URI", "softkms:path=/nonexistent;pin-value=s3cr3t-pin", "pin-value=REDACTED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := keystore.OpenKey(context.Background(), tt.uri)
			if !errors.Is(err, keystore.ErrKeyURI) {
				t.Fatalf("OpenKey: %v, want ErrKeyURI", err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("error %q does not say %q", err, tt.wantMsg)
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Fatalf("error %q contains the PIN", err)
			}
		})
	}
}

func TestRedactKeyURI(t *testing.T) {
	tests := []struct{ in, want string }{
		{"pkcs11:token=ca;id=01?pin-value=1234", "pkcs11:token=ca;id=01?pin-value=REDACTED"},
		{"pkcs11:token=ca;pin-value=1234;id=01", "pkcs11:token=ca;pin-value=REDACTED;id=01"},
		{"pkcs11:token=ca;PIN-VALUE=1234", "pkcs11:token=ca;PIN-VALUE=REDACTED"},
		{"pkcs11:token=ca;pin%2Dvalue=1234", "pkcs11:token=ca;pin%2Dvalue=REDACTED"},
		{"pkcs11:token=ca;id=01?pin-source=/run/pin&module-path=/x.so", "pkcs11:token=ca;id=01?pin-source=/run/pin&module-path=/x.so"},
		{"cloudkms:projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1", "cloudkms:projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1"},
		{"awskms:key-id=abc;region=eu-west-1", "awskms:key-id=abc;region=eu-west-1"},
		{"azurekms:name=ca;vault=v;client-id=abc;client-secret=S3cr3t;tenant-id=t", "azurekms:name=ca;vault=v;client-id=abc;client-secret=REDACTED;tenant-id=t"},
		{"yubikey:slot-id=9c?pin=123456&management-key=0102", "yubikey:slot-id=9c?pin=REDACTED&management-key=REDACTED"},
		{"example:key=k;db-Password=hunter2;api-secret-key=x", "example:key=k;db-Password=REDACTED;api-secret-key=REDACTED"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := keystore.RedactKeyURI(tt.in)
			if err != nil || got != tt.want {
				t.Fatalf("RedactKeyURI(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

// Whatever the URI, the redacted one gives the KMS libraries no secret:
// every PIN or client secret they would read from it is REDACTED.
func FuzzRedactKeyURI(f *testing.F) {
	for _, s := range []string{"pkcs11:token=ca;id=01?pin-value=1234", "pkcs11:pin-value=1234", "a:b?c=d&pin-value=x;y", "pkcs11:pin%2dvalue=99",
		"azurekms:name=k;client-secret=s", "yubikey:slot-id=9c?pin=1&management-key=2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := keystore.RedactKeyURI(s)
		if err != nil {
			return
		}
		u, err := uri.Parse(got)
		if err != nil {
			return
		}
		values := uri.Values(u)
		for _, k := range []string{"pin-value", "pin", "client-secret", "management-key"} {
			for _, v := range values[k] {
				if v != "REDACTED" && v != "" {
					t.Fatalf("RedactKeyURI(%q) = %q: %s %q kept", s, got, k, v)
				}
			}
		}
	})
}

func TestCheckKeyURI(t *testing.T) {
	for _, tc := range []struct {
		uri, wantErr string
		remote       bool
	}{
		{uri: "awskms:key-id=k1;region=eu-west-1", remote: true},
		{uri: "pkcs11:token=ca;id=01?pin-source=/run/pin", remote: true},
		{uri: "softkms:path=/k.pem"},
		{uri: "/etc/ca/key.pem", wantErr: "not a KMS URI"},
		{uri: "bogus:foo", wantErr: `unknown KMS "bogus"`},
	} {
		err := keystore.CheckKeyURI(tc.uri)
		if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("CheckKeyURI(%q) = %v, want %q", tc.uri, err, tc.wantErr)
		}
		if got := keystore.SignsRemotely(tc.uri); got != tc.remote {
			t.Errorf("SignsRemotely(%q) = %v", tc.uri, got)
		}
	}
}
