package keystore_test

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestDirWatcherReloadsAndRefuses(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	first := testca.NewIntermediate(t, root, testca.P256)
	second := testca.NewIntermediate(t, root, testca.P256)
	stranger := testca.NewRoot(t, testca.P256)
	dir := writeDir(t, istioFiles(t, first, root))

	var applied []*ca.Material
	refuse := false
	w, err := keystore.NewDirWatcher(keystore.DirWatcherConfig{Dir: dir, Apply: func(m *ca.Material) error {
		if refuse {
			return errors.New("authority refused it")
		}
		applied = append(applied, m)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name    string
		files   map[string][]byte
		refuse  bool
		want    bool
		wantNew *testca.CA
	}{
		{name: "unchanged directory", want: false},
		{name: "intermediate replaced", files: istioFiles(t, second, root), want: true, wantNew: second},
		{name: "same content again", files: istioFiles(t, second, root), want: false},
		{name: "key of another CA", files: map[string][]byte{"ca-key.pem": pemKey(t, stranger.Key, "pkcs8")}, want: false},
		{name: "signing cert not under the roots", files: istioFiles(t, stranger, root), want: false},
		{name: "file removed", files: map[string][]byte{"ca-key.pem": nil}, want: false},
		{name: "valid but refused by the authority", files: istioFiles(t, first, root), refuse: true, want: false},
		{name: "good material after bad", files: istioFiles(t, second, root), want: true, wantNew: second},
	}
	for _, s := range steps {
		for name, content := range s.files {
			path := filepath.Join(dir, name)
			if content == nil {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := os.WriteFile(path, content, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		refuse = s.refuse
		before := len(applied)
		if got := w.Poll(); got != s.want {
			t.Fatalf("%s: Poll() = %v, want %v", s.name, got, s.want)
		}
		if s.wantNew != nil && (len(applied) != before+1 || !applied[len(applied)-1].Cert.Equal(s.wantNew.Cert)) {
			t.Fatalf("%s: the new signing certificate was not applied", s.name)
		}
	}
}

func istioFiles(t *testing.T, signing, root *testca.CA) map[string][]byte {
	return map[string][]byte{
		"ca-cert.pem":    pemCerts(signing.Cert),
		"ca-key.pem":     pemKey(t, signing.Key, "pkcs8"),
		"root-cert.pem":  pemCerts(root.Cert),
		"cert-chain.pem": pemCerts(signing.Cert),
	}
}

// With Root, the watcher loads a plug-in root directory: a new signing
// root with the old one kept in the bundle is applied, also when its
// certificate and key are written in place one after the other; a root
// with the wrong key is refused.
func TestDirWatcherRootDir(t *testing.T) {
	old := testca.NewRoot(t, testca.P256)
	next := testca.NewRoot(t, testca.P256)
	rootFiles := func(signing *testca.CA, bundle ...*testca.CA) map[string][]byte {
		certs := []*x509.Certificate{signing.Cert}
		for _, b := range bundle {
			certs = append(certs, b.Cert)
		}
		return map[string][]byte{keystore.IstioRootFile: pemCerts(certs...), keystore.IstioRootKeyFile: pemKey(t, signing.Key, "pkcs8")}
	}
	dir := writeDir(t, rootFiles(old))
	var applied []*ca.Material
	w, err := keystore.NewDirWatcher(keystore.DirWatcherConfig{Dir: dir, Root: true, Apply: func(m *ca.Material) error {
		applied = append(applied, m)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	write := func(files map[string][]byte) {
		t.Helper()
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	files := rootFiles(next, old)
	write(map[string][]byte{keystore.IstioRootFile: files[keystore.IstioRootFile]})
	if w.Poll() || len(applied) != 0 {
		t.Fatal("the new signing root was applied with the old root's key")
	}
	write(map[string][]byte{keystore.IstioRootKeyFile: files[keystore.IstioRootKeyFile]})
	if !w.Poll() || len(applied) != 1 || !applied[0].Cert.Equal(next.Cert) || len(applied[0].Roots) != 2 {
		t.Fatalf("new signing root with the old in the bundle not applied once its key arrived: %d applied", len(applied))
	}
	write(map[string][]byte{keystore.IstioRootKeyFile: pemKey(t, old.Key, "pkcs8")})
	if w.Poll() || len(applied) != 1 {
		t.Fatal("a signing root with another root's key was applied")
	}
}

// Content refused once is tried again, unchanged, after RetryRefused (and
// not before): the authority may accept later what it refused for the
// time being.
func TestDirWatcherRetriesRefused(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	first := testca.NewIntermediate(t, root, testca.P256)
	second := testca.NewIntermediate(t, root, testca.P256)
	dir := writeDir(t, istioFiles(t, first, root))
	clk := clocktesting.NewFakeClock(time.Now())
	var applied, refusals int
	refuse := true
	w, err := keystore.NewDirWatcher(keystore.DirWatcherConfig{Dir: dir, Clock: clk, RetryRefused: time.Minute, Apply: func(*ca.Material) error {
		if refuse {
			refusals++
			return errors.New("not yet")
		}
		applied++
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range istioFiles(t, second, root) {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if w.Poll() || refusals != 1 {
		t.Fatalf("changed content: %d refusals, want 1", refusals)
	}
	clk.Step(30 * time.Second)
	if w.Poll() || refusals != 1 {
		t.Fatalf("before RetryRefused: tried again (%d refusals)", refusals)
	}
	clk.Step(30 * time.Second)
	if w.Poll() || refusals != 2 {
		t.Fatalf("after RetryRefused: %d refusals, want a second try", refusals)
	}
	refuse = false
	clk.Step(time.Minute)
	if !w.Poll() || applied != 1 {
		t.Fatalf("unchanged content accepted on retry: applied %d times, want once", applied)
	}
	clk.Step(time.Minute)
	if w.Poll() || applied != 1 {
		t.Fatal("applied content tried again")
	}
}
