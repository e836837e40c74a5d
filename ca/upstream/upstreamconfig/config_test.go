package upstreamconfig

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestLoadUpstream(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	leafish := testca.NewRoot(t, testca.P256, func(c *x509.Certificate) { c.IsCA = false })
	vault := "vault: {address: https://vault:8200, tokenFile: /t}\n"
	anchors := func(n int) func(t *testing.T, u *Config) {
		return func(t *testing.T, u *Config) {
			if len(u.TrustAnchors) != n {
				t.Errorf("%d anchors, want %d", len(u.TrustAnchors), n)
			}
		}
	}
	tests := []struct {
		name    string
		yaml    string
		wantErr string
		check   func(t *testing.T, u *Config)
	}{
		{name: "vault with a token file, defaults", yaml: "vault: {address: https://vault:8200, tokenFile: /t}\n",
			check: func(t *testing.T, u *Config) {
				if u.Vault.Mount != "pki" || u.Timeout != time.Minute || u.ReadyMargin != time.Hour || u.NameConstraints {
					t.Errorf("defaults: %+v %+v", u, u.Vault)
				}
			}},
		{name: "vault with Kubernetes auth", yaml: "vault: {address: https://vault:8200, mount: pki_int, kubernetes: {role: ca, tokenFile: /var/run/secrets/workload-ca/upstream/token}}\nnameConstraints: true\ntimeout: 5s\nreadyMargin: 10m\n",
			check: func(t *testing.T, u *Config) {
				if u.Vault.KubernetesRole != "ca" || u.Vault.Mount != "pki_int" || u.Timeout != 5*time.Second || u.ReadyMargin != 10*time.Minute || !u.NameConstraints {
					t.Errorf("got %+v %+v", u, u.Vault)
				}
			}},
		{name: "cert-manager ClusterIssuer in the CA's namespace", yaml: "certManager: {issuerRef: {name: corp, kind: ClusterIssuer}}\n",
			check: func(t *testing.T, u *Config) {
				if c := u.CertManager; c.Namespace != "istio-system" || c.IssuerKind != "ClusterIssuer" || c.IssuerGroup != "cert-manager.io" {
					t.Errorf("got %+v", c)
				}
			}},
		{name: "no upstream", yaml: "nameConstraints: true\n", wantErr: "exactly one upstream"},
		{name: "two upstreams", yaml: "vault: {address: https://v, tokenFile: /t}\ncertManager: {issuerRef: {name: corp}}\n", wantErr: "exactly one upstream"},
		{name: "vault without auth", yaml: "vault: {address: https://vault:8200}\n", wantErr: "exactly one of a token file"},
		{name: "vault Kubernetes auth without role", yaml: "vault: {address: https://v, kubernetes: {mount: k, tokenFile: /t}}\n", wantErr: "role is required"},
		// No default token file (it was the pod's API token), https only.
		{name: "vault Kubernetes auth without a token file", yaml: "vault: {address: https://v, kubernetes: {role: ca}}\n", wantErr: "projected token"},
		{name: "vault over http", yaml: "vault: {address: http://vault:8200, tokenFile: /t}\n", wantErr: "want https"},
		{name: "cert-manager without issuer", yaml: "certManager: {issuerRef: {kind: Issuer}}\n", wantErr: "issuer name"},
		{name: "cert-manager unknown kind", yaml: "certManager: {issuerRef: {name: x, kind: Vault}}\n", wantErr: "want Issuer or ClusterIssuer"},
		{name: "unknown field", yaml: "vault: {address: https://v, tokenFile: /t, roles: x}\n", wantErr: "unknown field"},
		{name: "negative margin", yaml: "vault: {address: https://v, tokenFile: /t}\nreadyMargin: -1s\n", wantErr: "readyMargin"},
		// trustAnchorFile pins CA certificates only, and does not combine
		// with allowAnchorChange.
		{name: "pinned root", yaml: vault + "trustAnchorFile: " + testca.WritePEM(t, root.Cert) + "\n", check: anchors(1)},
		{name: "pinned certificate not a CA", yaml: vault + "trustAnchorFile: " + testca.WritePEM(t, leafish.Cert) + "\n", wantErr: "not a CA certificate"},
		{name: "pinned file missing", yaml: vault + "trustAnchorFile: /nonexistent/anchors.pem\n", wantErr: "trustAnchorFile"},
		{name: "pinned and change allowed", yaml: vault + "trustAnchorFile: " + testca.WritePEM(t, root.Cert) + "\nallowAnchorChange: true\n",
			wantErr: "drop one"},
		{name: "change allowed, not pinned", yaml: vault + "allowAnchorChange: true\n", check: anchors(0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "upstream.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			u, err := Load(path, "istio-system")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, u)
		})
	}
}
