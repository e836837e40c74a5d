package keystore_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

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
