package spireserver

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TestConfigValidates has the real spire-server check the configuration
// Config writes (`spire-server validate`, which refuses unknown keys); a
// misspelt key shows that it does check.
func TestConfigValidates(t *testing.T) {
	bin := os.Getenv(EnvBinary)
	if bin == "" {
		t.Skip(EnvBinary + " is unset: `make e2e` builds spire-server (make spire) and sets it")
	}
	peer := Peer{TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local"), URL: "https://127.0.0.1:8443/",
		EndpointSPIFFEID: spiffeid.RequireFromString("spiffe://cluster.local/workload-ca/bundle-endpoint")}
	for _, tc := range []struct {
		name   string
		opts   Options
		edit   func(string) string
		wantOK bool
	}{
		{name: "bundle endpoint only", opts: Options{}, wantOK: true},
		{name: "a peer and a refresh hint", opts: Options{RefreshHint: time.Minute, FederatesWith: []Peer{peer}}, wantOK: true},
		{name: "a misspelt key is refused", opts: Options{FederatesWith: []Peer{peer}},
			edit: func(s string) string { return strings.Replace(s, "endpoint_spiffe_id", "endpoint_spiffeid", 1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Binary, tc.opts.Dir = bin, t.TempDir()
			tc.opts.TrustDomain = spiffeid.RequireTrustDomainFromString("spire.example")
			conf := Config(tc.opts, 8081, 8443)
			if tc.edit != nil {
				conf = tc.edit(conf)
			}
			path := filepath.Join(tc.opts.Dir, "server.conf")
			if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.CommandContext(t.Context(), bin, "validate", "-config", path).CombinedOutput()
			if ok := err == nil; ok != tc.wantOK {
				t.Errorf("spire-server validate: %v, want valid %v; output:\n%s\nconfiguration:\n%s", err, tc.wantOK, out, conf)
			}
		})
	}
}
