package cahost

import (
	"os"
	"path/filepath"
	"testing"
)

func TestFlagValue(t *testing.T) {
	tests := []struct {
		args      []string
		want      string
		wantFound bool
	}{
		{nil, "", false},
		{[]string{"--ca-secret", "ns/name"}, "ns/name", true},
		{[]string{"--ca-secret=ns/name"}, "ns/name", true},
		{[]string{"--ca-secret", "a/b", "--ca-secret=c/d"}, "c/d", true},
		{[]string{"--ca-secret"}, "", false}, // no value: the binary refuses it
		{[]string{"--ca-secret-x", "ns/name", "--signer-name", "--ca-secret"}, "", false},
	}
	for _, tt := range tests {
		got, found := flagValue(tt.args, "ca-secret")
		if got != tt.want || found != tt.wantFound {
			t.Errorf("flagValue(%q) = %q, %v; want %q, %v", tt.args, got, found, tt.want, tt.wantFound)
		}
	}
}

func TestDefaultRootsFromRootDir(t *testing.T) {
	for _, file := range []string{"root-cert.pem", "ca.crt"} {
		t.Run(file, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, file), []byte("roots"), 0o600); err != nil {
				t.Fatal(err)
			}
			c := &CA{opts: Options{ExtraArgs: []string{"--ca-secret", "ns/ca", "--ca-root-dir=" + dir}}}
			if err := c.defaultRoots(); err != nil {
				t.Fatal(err)
			}
			if got, err := c.RootsPEM(t.Context()); err != nil || string(got) != "roots" {
				t.Fatalf("RootsPEM = %q, %v; want the content of %s", got, err, file)
			}
		})
	}
	t.Run("--ca-dir mode keeps the file the CA writes", func(t *testing.T) {
		c := &CA{opts: Options{ExtraArgs: []string{"--ca-root-dir", "/ignored"}}}
		if err := c.defaultRoots(); err != nil || c.opts.Roots != nil {
			t.Fatalf("defaultRoots: %v, Roots set %v", err, c.opts.Roots != nil)
		}
	})
}
