package keystore_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.step.sm/crypto/keyutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestLoadOrCreatePersistsTheRoot(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	now := time.Now().UTC().Truncate(time.Second)
	dir := filepath.Join(t.TempDir(), "cacerts")

	first, created, err := keystore.LoadOrCreate(dir, keystore.GenerateOptions{TrustDomain: td}, now)
	if err != nil || !created {
		t.Fatalf("first LoadOrCreate = created %v, %v; want a new root", created, err)
	}
	checkMode(t, dir, 0o700)
	checkMode(t, filepath.Join(dir, keystore.IstioKeyFile), 0o600)
	for _, name := range []string{keystore.IstioCertFile, keystore.IstioRootFile} {
		checkMode(t, filepath.Join(dir, name), 0o644)
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(matches) != 0 {
		t.Errorf("temporary files left behind: %v", matches)
	}

	second, created, err := keystore.LoadOrCreate(dir, keystore.GenerateOptions{TrustDomain: td}, now.Add(time.Hour))
	if err != nil || created {
		t.Fatalf("second LoadOrCreate = created %v, %v; want the stored root", created, err)
	}
	if !second.Cert.Equal(first.Cert) || !keyutil.Equal(second.Signer, first.Signer) {
		t.Fatal("reloaded root differs from the generated one")
	}
	issueAndVerify(t, td, second, now)
}

func TestGenerateRoot(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	now := time.Now().UTC().Truncate(time.Second)
	tests := []struct {
		keyType string
		check   func(any) bool
	}{
		{"", isEC(elliptic.P256())},
		{keystore.KeyECDSAP256, isEC(elliptic.P256())},
		{keystore.KeyECDSAP384, isEC(elliptic.P384())},
		{keystore.KeyRSA2048, isRSA(2048)},
		{keystore.KeyRSA3072, isRSA(3072)},
	}
	for _, tt := range tests {
		t.Run("key "+tt.keyType, func(t *testing.T) {
			m, err := keystore.GenerateRoot(keystore.GenerateOptions{TrustDomain: td, KeyType: tt.keyType}, now)
			if err != nil {
				t.Fatalf("GenerateRoot: %v", err)
			}
			if !tt.check(m.Cert.PublicKey) {
				t.Errorf("public key %T is not a %q key", m.Cert.PublicKey, tt.keyType)
			}
			checkRoot(t, m.Cert, td, now)
			if err := m.Validate(now); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
	t.Run("unknown key type", func(t *testing.T) {
		if _, err := keystore.GenerateRoot(keystore.GenerateOptions{TrustDomain: td, KeyType: "dsa-1024"}, now); err == nil {
			t.Fatal("GenerateRoot accepted an unknown key type")
		}
	})
	t.Run("no trust domain", func(t *testing.T) {
		if _, err := keystore.GenerateRoot(keystore.GenerateOptions{}, now); err == nil {
			t.Fatal("GenerateRoot accepted an empty trust domain")
		}
	})
}

func TestLoadOrCreateRSAKeyPersists(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	dir := t.TempDir()
	opts := keystore.GenerateOptions{TrustDomain: td, KeyType: keystore.KeyRSA2048}
	if _, _, err := keystore.LoadOrCreate(dir, opts, time.Now()); err != nil {
		t.Fatal(err)
	}
	m, err := keystore.LoadDir(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !isRSA(2048)(m.Signer.Public()) {
		t.Fatalf("reloaded key is %T, want RSA-2048", m.Signer.Public())
	}
}

func TestLoadOrCreateNeverOverwritesPartialMaterial(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	root := testca.NewRoot(t, testca.P256)
	dir := writeDir(t, map[string][]byte{keystore.IstioCertFile: pemCerts(root.Cert)})
	_, created, err := keystore.LoadOrCreate(dir, keystore.GenerateOptions{TrustDomain: td}, time.Now())
	if !errors.Is(err, keystore.ErrIncomplete) || created {
		t.Fatalf("LoadOrCreate = created %v, %v; want ErrIncomplete", created, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory now holds %d files, want the 1 it had", len(entries))
	}
}

func checkRoot(t *testing.T, c *x509.Certificate, td spiffeid.TrustDomain, now time.Time) {
	t.Helper()
	if c.Subject.CommonName != keystore.RootCommonName || len(c.Subject.Organization) != 1 || c.Subject.Organization[0] != td.Name() {
		t.Errorf("subject = %q, want O=%s, CN=%s", c.Subject, td.Name(), keystore.RootCommonName)
	}
	if len(c.URIs) != 1 || c.URIs[0].String() != td.IDString() {
		t.Errorf("URIs = %v, want [%s]", c.URIs, td.IDString())
	}
	if !c.IsCA || !c.BasicConstraintsValid || c.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign || len(c.SubjectKeyId) == 0 {
		t.Errorf("IsCA=%v KeyUsage=%#x SKI=%x; want a CA with certSign|cRLSign and a SKI", c.IsCA, c.KeyUsage, c.SubjectKeyId)
	}
	if want := now.Add(keystore.DefaultRootLifetime); !c.NotAfter.Equal(want) {
		t.Errorf("NotAfter = %v, want %v", c.NotAfter, want)
	}
	if err := c.CheckSignatureFrom(c); err != nil {
		t.Errorf("not self-signed: %v", err)
	}
}

// issueAndVerify checks that the material works end to end: an Authority
// accepts it and the leaf it issues verifies against the root.
func issueAndVerify(t *testing.T, td spiffeid.TrustDomain, m *ca.Material, now time.Time) {
	t.Helper()
	issued := issueWith(t, td, m, now)
	pool := x509.NewCertPool()
	pool.AddCert(m.Cert)
	if _, err := issued.Cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now}); err != nil {
		t.Errorf("issued leaf does not verify against the generated root: %v", err)
	}
}

// issueWith has an Authority built on m issue a ztunnel-shaped leaf.
func issueWith(t *testing.T, td spiffeid.TrustDomain, m *ca.Material, now time.Time) *ca.Issued {
	t.Helper()
	a, err := ca.New(ca.Config{TrustDomain: td, Clock: testingclock.NewFakePassiveClock(now)}, m)
	if err != nil {
		t.Fatalf("ca.New: %v", err)
	}
	id := spiffeid.RequireFromPath(td, "/ns/a/sa/b")
	csrPEM, _ := testca.ZtunnelCSR(t, id)
	csr, err := ca.ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	issued, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: id})
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return issued
}

func checkMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s mode = %o, want %o", filepath.Base(path), got, want)
	}
}

func isEC(c elliptic.Curve) func(any) bool {
	return func(k any) bool { e, ok := k.(*ecdsa.PublicKey); return ok && e.Curve == c }
}

func isRSA(bits int) func(any) bool {
	return func(k any) bool { r, ok := k.(*rsa.PublicKey); return ok && r.N.BitLen() == bits }
}

// Rotation measures a CA's life from NotBefore: a short-lived root must not
// be backdated by a fixed hour, or it would be born past its rotation points.
func TestGenerateRootBackdate(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	now := time.Now().Truncate(time.Second)
	for _, tt := range []struct {
		lifetime, wantBackdate time.Duration
	}{
		{lifetime: 2 * 365 * 24 * time.Hour, wantBackdate: time.Hour},
		{lifetime: 60 * time.Minute, wantBackdate: 36 * time.Second},
		{lifetime: time.Minute, wantBackdate: 600 * time.Millisecond},
	} {
		m, err := keystore.GenerateRoot(keystore.GenerateOptions{TrustDomain: td, Lifetime: tt.lifetime}, now)
		if err != nil {
			t.Fatal(err)
		}
		if got := now.Sub(m.Cert.NotBefore); got > tt.wantBackdate+time.Second || got < tt.wantBackdate-time.Second { // X.509 times are whole seconds
			t.Errorf("lifetime %v: backdated %v, want %v", tt.lifetime, got, tt.wantBackdate)
		}
	}
}
