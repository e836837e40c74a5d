package cahost

import (
	"os"
	"path/filepath"
	"strings"
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

func TestServingAddrs(t *testing.T) {
	const serving = `{"level":"INFO","msg":"serving","addr":"127.0.0.1:40001","admin_addr":"127.0.0.1:40002"}`
	tests := []struct {
		name, log       string
		addr, adminAddr string
		wantErr         bool
	}{
		{name: "nothing logged yet", log: "", wantErr: true},
		{name: "before the listeners are bound", log: `{"msg":"CA loaded"}` + "\n", wantErr: true},
		{name: "serving line", log: `{"msg":"CA loaded"}` + "\n" + serving + "\n", addr: "127.0.0.1:40001", adminAddr: "127.0.0.1:40002"},
		{name: "non-JSON output is skipped", log: "panic: not yet\n" + serving, addr: "127.0.0.1:40001", adminAddr: "127.0.0.1:40002"},
		{name: "the first serving line wins", log: serving + "\n" + `{"msg":"serving","addr":"x:1","admin_addr":"x:2"}`, addr: "127.0.0.1:40001", adminAddr: "127.0.0.1:40002"},
		{name: "serving line without addresses", log: `{"msg":"serving"}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, admin, err := servingAddrs(strings.NewReader(tt.log))
			if (err != nil) != tt.wantErr || addr != tt.addr || admin != tt.adminAddr {
				t.Errorf("servingAddrs = %q, %q, %v; want %q, %q, error %v", addr, admin, err, tt.addr, tt.adminAddr, tt.wantErr)
			}
		})
	}
}
