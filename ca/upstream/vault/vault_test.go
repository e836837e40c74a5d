package vault

import (
	"strings"
	"testing"

	"github.com/hashicorp/vault/api"

	"github.com/workload-ca/workload-ca/internal/testca"
)

func pemOf(cas ...*testca.CA) string { return string(testca.BundlePEM(cas...)) }

// parseAnswer reads sign-intermediate's answer: the certificate, and the
// chain above it (ca_chain starts with the certificate itself).
func TestParseAnswer(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P256)
	ours := testca.NewIntermediate(t, mid, testca.P256)
	tests := []struct {
		name      string
		data      map[string]any
		wantChain int
		wantErr   string
	}{
		{"ca_chain with the certificate first", map[string]any{"certificate": pemOf(ours),
			"ca_chain": []any{pemOf(ours), pemOf(mid), pemOf(root)}}, 2, ""},
		{"ca_chain of bundles", map[string]any{"certificate": pemOf(ours), "ca_chain": []any{pemOf(ours, mid, root)}}, 2, ""},
		{"issuing_ca only", map[string]any{"certificate": pemOf(ours), "issuing_ca": pemOf(mid)}, 1, ""},
		{"no certificate", map[string]any{"ca_chain": []any{pemOf(mid)}}, 0, "certificate"},
		{"two certificates", map[string]any{"certificate": pemOf(ours, mid)}, 0, "certificate"},
		{"a key in the chain", map[string]any{"certificate": pemOf(ours), "ca_chain": []any{string(mid.KeyPEM(t))}}, 0, "ca_chain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseAnswer(&api.Secret{Data: tt.data})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseAnswer error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !got.Cert.Equal(ours.Cert) || len(got.Chain) != tt.wantChain || !got.Chain[0].Equal(mid.Cert) {
				t.Fatalf("parsed %d chain certificates, want %d starting at the issuer", len(got.Chain), tt.wantChain)
			}
		})
	}
}

func TestNewRequires(t *testing.T) {
	tests := map[string]Config{
		"no address":          {Mount: "pki", TokenFile: "/t"},
		"no mount":            {Address: "https://127.0.0.1:8200", TokenFile: "/t"},
		"no auth":             {Address: "https://127.0.0.1:8200", Mount: "pki"},
		"token file and role": {Address: "https://127.0.0.1:8200", Mount: "pki", TokenFile: "/t", KubernetesRole: "ca", KubernetesTokenFile: "/k"},
		"missing TLS CA file": {Address: "https://127.0.0.1:8200", Mount: "pki", TokenFile: "/t", CAFile: "/nonexistent/ca.pem"},
	}
	for name, cfg := range tests {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
	a, err := New(Config{Address: "https://127.0.0.1:8200", Mount: "/pki/", Issuer: "corp", KubernetesRole: "ca", KubernetesTokenFile: "/k"})
	if err != nil {
		t.Fatal(err)
	}
	if got := a.signPath(); got != "pki/issuer/corp/sign-intermediate" {
		t.Errorf("sign path %q", got)
	}
}

// TestVaultTokenAndTransport: no token file is read
// unless the configuration names one (the pod's API-audience token was the
// default, and went to Vault), and Vault is reached over https only.
func TestVaultTokenAndTransport(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"Kubernetes auth without a token file", Config{Address: "https://vault:8200", Mount: "pki", KubernetesRole: "ca"}, "projected token"},
		{"http address", Config{Address: "http://vault:8200", Mount: "pki", TokenFile: "/t"}, "want https"},
		{"http on loopback", Config{Address: "http://127.0.0.1:8200", Mount: "pki", TokenFile: "/t"}, "want https"},
		{"no scheme", Config{Address: "vault:8200", Mount: "pki", TokenFile: "/t"}, "https"},
		{"credentials in the URL", Config{Address: "https://user:pw@vault:8200", Mount: "pki", TokenFile: "/t"}, "want https://host"},
		{"https with a projected token", Config{Address: "https://vault:8200", Mount: "pki", KubernetesRole: "ca",
			KubernetesTokenFile: "/var/run/secrets/workload-ca/upstream/token"}, ""},
		{"https with a Vault token file", Config{Address: "https://vault.example.com", Mount: "pki", TokenFile: "/t"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := New(tt.cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tt.cfg.KubernetesRole != "" && a.cfg.KubernetesTokenFile != tt.cfg.KubernetesTokenFile {
					t.Fatalf("token file %q, want the configured one", a.cfg.KubernetesTokenFile)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
