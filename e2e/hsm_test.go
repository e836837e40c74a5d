package e2e_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// softHSMModule is where Debian's softhsm2 package puts the PKCS#11 module
// (make e2e installs the package); WORKLOAD_CA_SOFTHSM2_MODULE overrides it.
const softHSMModule = "/usr/lib/softhsm/libsofthsm2.so"

// softHSM is a SoftHSM2 token of its own: a configuration file pointing at
// a token directory, for the CA (SOFTHSM2_CONF) and for softhsm2-util.
type softHSM struct {
	module, conf, token, pin string
}

func newSoftHSM(t *testing.T, dir string) *softHSM {
	t.Helper()
	module := softHSMModule
	if m := os.Getenv("WORKLOAD_CA_SOFTHSM2_MODULE"); m != "" {
		module = m
	}
	if _, err := os.Stat(module); err != nil {
		t.Fatalf("SoftHSM2's PKCS#11 module: %v (make e2e installs the softhsm2 package)", err)
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.MkdirAll(tokens, 0o700); err != nil {
		t.Fatal(err)
	}
	h := &softHSM{module: module, conf: filepath.Join(dir, "softhsm2.conf"), token: "workload-ca", pin: "4711-e2e"}
	conf := fmt.Sprintf("directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\n", tokens)
	if err := os.WriteFile(h.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	h.util(t, "--init-token", "--free", "--label", h.token, "--pin", h.pin, "--so-pin", "so-"+h.pin)
	return h
}

func (h *softHSM) env() []string { return []string{"SOFTHSM2_CONF=" + h.conf} }

func (h *softHSM) util(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "softhsm2-util", args...)
	cmd.Env = append(os.Environ(), h.env()...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("softhsm2-util %s: %v\n%s", args[0], err, out)
	}
}

// importKey stores ca's private key in the token under id (hex) and
// removes every copy of it from disk.
func (h *softHSM) importKey(t *testing.T, dir string, ca *testca.CA, id string) {
	t.Helper()
	path := filepath.Join(dir, "import-"+id+".pem")
	if err := os.WriteFile(path, ca.KeyPEM(t), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	h.util(t, "--import", path, "--token", h.token, "--label", "ca-"+id, "--id", id, "--pin", h.pin)
}

// keyURI is the PKCS#11 URI of the key with id, the PIN read from pinFile.
func (h *softHSM) keyURI(id, pinFile string) string {
	return fmt.Sprintf("pkcs11:module-path=%s;token=%s;id=%%%s?pin-source=%s", h.module, h.token, id, pinFile)
}

// TestHSMKey runs the CA with its signing key in an HSM (SoftHSM2, through
// PKCS#11, by --ca-key-uri): the CA directory holds the certificates and
// no key. Leaves verify against the root, are issued by the HSM key's
// certificate, and the CA logs the key's URI without the PIN. A key URI
// whose key is not the certificate's, or a key file beside the URI, stops
// the CA at start with an error that says so.
func TestHSMKey(t *testing.T) {
	f := newLCFixture(t, "hsm")
	hsm := newSoftHSM(t, filepath.Join(f.dir, "hsm"))
	root := testca.NewRoot(t, testca.P256)
	signing := testca.NewIntermediate(t, root, testca.P256)
	other := testca.NewRoot(t, testca.P256)
	hsm.importKey(t, f.dir, signing, "01")
	hsm.importKey(t, f.dir, other, "02")
	pinFile := filepath.Join(f.dir, "pin")
	if err := os.WriteFile(pinFile, []byte(hsm.pin+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	workDir := func(name string, files map[string][]byte) string {
		t.Helper()
		dir := filepath.Join(f.dir, name)
		writeFiles(t, filepath.Join(dir, "ca"), files)
		return dir
	}
	certsOnly := map[string][]byte{
		"ca-cert.pem": signing.CertPEM(), "cert-chain.pem": append(signing.CertPEM(), root.CertPEM()...), "root-cert.pem": root.CertPEM(),
	}

	ca, err := cahost.Start(t.Context(), cahost.Options{Kubeconfig: f.s.cp.KubeconfigPath(), WorkDir: workDir("serve", certsOnly),
		Env: hsm.env(), ExtraArgs: append(f.args(false), "--ca-key-uri", hsm.keyURI("01", pinFile))})
	if err != nil {
		t.Fatal(err)
	}
	f.stopAtCleanup(t, ca)
	res := requestFrom(t, ca, f.s.ztunnelA, id("demo", "web"))
	if err := verifiesWith(res.Leaf, res.Chain, []*x509.Certificate{root.Cert}, time.Now()); err != nil {
		t.Fatalf("leaf does not verify against the root: %v", err)
	}
	if err := res.Leaf.CheckSignatureFrom(signing.Cert); err != nil {
		t.Fatalf("leaf not signed by the HSM key's certificate: %v", err)
	}
	logs := ca.Logs()
	if !strings.Contains(logs, `"msg":"CA key opened"`) || !strings.Contains(logs, "token=workload-ca") {
		t.Errorf("no log line names the key URI:\n%s", lastLines(logs, 20))
	}
	if strings.Contains(logs, hsm.pin) {
		t.Errorf("the log contains the PIN")
	}

	refused := []struct {
		name  string
		files map[string][]byte
		uri   string
		want  string
	}{
		{"key of another certificate", certsOnly, hsm.keyURI("02", pinFile), "signing key does not match"},
		{"key file beside the key URI", map[string][]byte{"ca-cert.pem": signing.CertPEM(), "root-cert.pem": root.CertPEM(),
			"ca-key.pem": signing.KeyPEM(t)}, hsm.keyURI("01", pinFile), "ca-key.pem is there although"},
		{"no such key, PIN in the URI", certsOnly,
			fmt.Sprintf("pkcs11:module-path=%s;token=%s;id=%%09?pin-value=%s", hsm.module, hsm.token, hsm.pin), "not found"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			dir := workDir("refused-"+strings.ReplaceAll(tt.name, " ", "-"), tt.files)
			said := checkRefusedStart(t, dir, tt.want, func() (*cahost.CA, error) {
				return cahost.Start(ctx, cahost.Options{Kubeconfig: f.s.cp.KubeconfigPath(), WorkDir: dir,
					Env: hsm.env(), ExtraArgs: append(f.args(false), "--ca-key-uri", tt.uri)})
			})
			if strings.Contains(said, hsm.pin) {
				t.Errorf("the error or the log contains the PIN")
			}
		})
	}
}

// TestHSMRootKey runs the CA on intermediates of a plug-in root whose key
// is in an HSM (--ca-root-dir holds root-cert.pem only): the HSM signs the
// intermediate the CA mints, and leaves chain through it to the root.
func TestHSMRootKey(t *testing.T) {
	f := newLCFixture(t, "hsmroot")
	hsm := newSoftHSM(t, filepath.Join(f.dir, "hsm"))
	f.env = hsm.env()
	root := testca.NewRoot(t, testca.P256)
	hsm.importKey(t, f.dir, root, "0a")
	pinFile := filepath.Join(f.dir, "pin")
	if err := os.WriteFile(pinFile, []byte(hsm.pin), 0o600); err != nil {
		t.Fatal(err)
	}
	checkRootKeyURI(t, f, root, hsm.keyURI("0a", pinFile))
}

// checkRootKeyURI runs the CA with --ca-root-dir holding root's
// certificate only and root's key at keyURI, and checks that a leaf
// chains to root through one intermediate that key signed.
func checkRootKeyURI(t *testing.T, f *lcFixture, root *testca.CA, keyURI string) {
	t.Helper()
	rootDir := filepath.Join(f.dir, "root")
	writeFiles(t, rootDir, map[string][]byte{"root-cert.pem": root.CertPEM()})
	ca, err := f.startReplica(t.Context(), "", true, "--ca-root-dir", rootDir, "--ca-key-uri", keyURI)
	if err != nil {
		t.Fatal(err)
	}
	f.stopAtCleanup(t, ca)
	res := requestFrom(t, ca, f.s.ztunnelA, id("demo", "web"))
	if err := verifiesWith(res.Leaf, res.Chain, []*x509.Certificate{root.Cert}, time.Now()); err != nil {
		t.Fatalf("leaf does not verify against the root: %v", err)
	}
	if len(res.Chain) != 1 || res.Chain[0].CheckSignatureFrom(root.Cert) != nil {
		t.Fatalf("want one intermediate signed by the root key, got %d certificates", len(res.Chain))
	}
}

func writeFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// checkRefusedStart checks that start, a CA in work dir dir, fails, and
// that its error or the CA's log says want. It returns both, for further
// checks.
func checkRefusedStart(t *testing.T, dir, want string, start func() (*cahost.CA, error)) string {
	t.Helper()
	ca, err := start()
	if err == nil {
		_ = ca.Stop()
		t.Fatal("the CA started")
	}
	logs, _ := os.ReadFile(cahost.LogPath(dir)) // none if it never ran
	t.Logf("refused: %v", err)
	said := err.Error() + string(logs)
	if !strings.Contains(said, want) {
		t.Errorf("start error %v, log %q: want %q", err, logs, want)
	}
	return said
}
