package e2e_test

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/internal/proc"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// envLocalKMS overrides the local-kms binary (default: bin/local-kms,
// which make e2e builds from e2e/kmstools/go.mod).
const envLocalKMS = "WORKLOAD_CA_LOCAL_KMS"

// localKMS is a local-kms process: the AWS KMS API on a port of its own,
// holding the keys it was seeded with.
type localKMS struct {
	endpoint string
}

// startLocalKMS runs local-kms with keys (by key id) imported at start,
// and stops it when t ends.
func startLocalKMS(t *testing.T, dir string, keys map[string]*testca.CA) *localKMS {
	t.Helper()
	bin := toolBinary(t, "local-kms", envLocalKMS)
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	var seed strings.Builder
	seed.WriteString("Keys:\n  Asymmetric:\n    Ecc:\n")
	for id, ca := range keys {
		der, err := x509.MarshalECPrivateKey(ca.Key.(*ecdsa.PrivateKey))
		if err != nil {
			t.Fatal(err)
		}
		keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
		fmt.Fprintf(&seed, "      - Metadata:\n          KeyId: %s\n          KeyUsage: SIGN_VERIFY\n        PrivateKeyPem: |\n", id)
		for line := range strings.SplitSeq(strings.TrimSpace(string(keyPEM)), "\n") {
			fmt.Fprintf(&seed, "          %s\n", line)
		}
	}
	seedPath := filepath.Join(dir, "seed.yaml")
	if err := os.WriteFile(seedPath, []byte(seed.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "local-kms.log"))
	if err != nil {
		t.Fatal(err)
	}
	// Port 0: local-kms binds a free port and logs which.
	p, err := proc.Start("local-kms", bin, nil, proc.Environ("PORT=0", "KMS_REGION=us-east-1",
		"KMS_ACCOUNT_ID=111122223333", "KMS_DATA_PATH="+filepath.Join(dir, "data"), "KMS_SEED_PATH="+seedPath), log, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Kill(10 * time.Second)
		_ = log.Close()
	})
	started := regexp.MustCompile(`Local KMS started on 0\.0\.0\.0:(\d+)`)
	var port string
	err = pollUntil(t, 30*time.Second, func() (bool, error) {
		if p.Exited() {
			return false, p.StartupError()
		}
		if m := started.FindStringSubmatch(p.Tail()); m != nil {
			port = m[1]
		}
		return port != "", nil
	})
	if err != nil {
		t.Fatalf("local-kms did not start: %v; last output:\n%s", err, p.Tail())
	}
	return &localKMS{endpoint: "http://127.0.0.1:" + port}
}

// env points the AWS SDK in the CA at local-kms, with credentials that
// only it accepts and nothing read from this machine's AWS configuration.
func (k *localKMS) env(dir string) []string {
	none := filepath.Join(dir, "no-aws-config")
	return []string{"AWS_ENDPOINT_URL_KMS=" + k.endpoint, "AWS_ACCESS_KEY_ID=e2e", "AWS_SECRET_ACCESS_KEY=e2e",
		"AWS_CONFIG_FILE=" + none, "AWS_SHARED_CREDENTIALS_FILE=" + none, "AWS_EC2_METADATA_DISABLED=true"}
}

// keyURI is the awskms: URI of key id.
func (k *localKMS) keyURI(id string) string {
	return "awskms:key-id=" + id + ";region=us-east-1"
}

// TestAWSKMS runs the CA with its keys in AWS KMS (--ca-key-uri awskms:),
// through the AWS SDK the release binary carries, against local-kms, an
// emulator of the KMS API: a signing key that signs every leaf, and a
// plug-in root's key that signs the intermediate the CA mints. A key that
// is not the certificate's, or one the KMS does not hold, stops the CA at
// start.
func TestAWSKMS(t *testing.T) {
	f := newLCFixture(t, "awskms")
	root := testca.NewRoot(t, testca.P256)
	signing := testca.NewIntermediate(t, root, testca.P256)
	const signingID, rootID = "6f0e7e0a-56a1-4d36-9b0e-2b4c1f0d0a01", "6f0e7e0a-56a1-4d36-9b0e-2b4c1f0d0a02"
	kms := startLocalKMS(t, filepath.Join(f.dir, "kms"), map[string]*testca.CA{signingID: signing, rootID: root})
	f.env = kms.env(f.dir)
	certsOnly := map[string][]byte{
		"ca-cert.pem": signing.CertPEM(), "cert-chain.pem": append(signing.CertPEM(), root.CertPEM()...), "root-cert.pem": root.CertPEM(),
	}
	// withCertsOnly starts a replica whose CA directory holds the signing
	// certificate and no key.
	withCertsOnly := func(t *testing.T, name, keyURI string) (*cahost.CA, error) {
		t.Helper()
		workDir := filepath.Join(f.dir, name)
		writeFiles(t, filepath.Join(workDir, "ca"), certsOnly)
		return f.startReplica(t.Context(), workDir, false, "--ca-key-uri", keyURI)
	}

	t.Run("the KMS key signs every leaf", func(t *testing.T) {
		ca, err := withCertsOnly(t, "signing", kms.keyURI(signingID))
		if err != nil {
			t.Fatal(err)
		}
		f.stopAtCleanup(t, ca)
		for _, sa := range []string{"web", "api"} {
			res := requestFrom(t, ca, f.s.ztunnelA, id("demo", sa))
			if err := verifiesWith(res.Leaf, res.Chain, []*x509.Certificate{root.Cert}, time.Now()); err != nil {
				t.Fatalf("leaf does not verify against the root: %v", err)
			}
			if err := res.Leaf.CheckSignatureFrom(signing.Cert); err != nil {
				t.Fatalf("leaf not signed by the KMS key's certificate: %v", err)
			}
		}
		if lines := logLines(ca, "CA key opened", "awskms:key-id="+signingID); len(lines) != 1 {
			t.Errorf("log lines naming the key: %q, want 1", lines)
		}
	})

	t.Run("the KMS root key signs the intermediate", func(t *testing.T) {
		checkRootKeyURI(t, f, root, kms.keyURI(rootID))
	})

	for _, tt := range []struct{ name, dir, keyID, want string }{
		{"a key that is not the certificate's stops the CA", "mismatch", rootID, "signing key does not match"},
		{"a key the KMS does not hold stops the CA", "missing", "6f0e7e0a-56a1-4d36-9b0e-2b4c1f0d0a09", "NotFoundException"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkRefusedStart(t, filepath.Join(f.dir, tt.dir), tt.want, func() (*cahost.CA, error) {
				return withCertsOnly(t, tt.dir, kms.keyURI(tt.keyID))
			})
		})
	}
}
