package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadUpstream(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr string
		check   func(t *testing.T, u *upstreamConfig)
	}{
		{name: "vault with a token file, defaults", yaml: "vault: {address: https://vault:8200, tokenFile: /t}\n",
			check: func(t *testing.T, u *upstreamConfig) {
				if u.Vault.Mount != "pki" || u.Timeout != time.Minute || u.ReadyMargin != time.Hour || u.NameConstraints {
					t.Errorf("defaults: %+v %+v", u, u.Vault)
				}
			}},
		{name: "vault with Kubernetes auth", yaml: "vault: {address: https://vault:8200, mount: pki_int, kubernetes: {role: ca}}\nnameConstraints: true\ntimeout: 5s\nreadyMargin: 10m\n",
			check: func(t *testing.T, u *upstreamConfig) {
				if u.Vault.KubernetesRole != "ca" || u.Vault.Mount != "pki_int" || u.Timeout != 5*time.Second || u.ReadyMargin != 10*time.Minute || !u.NameConstraints {
					t.Errorf("got %+v %+v", u, u.Vault)
				}
			}},
		{name: "cert-manager ClusterIssuer in the CA's namespace", yaml: "certManager: {issuerRef: {name: corp, kind: ClusterIssuer}}\n",
			check: func(t *testing.T, u *upstreamConfig) {
				if c := u.CertManager; c.Namespace != "istio-system" || c.IssuerKind != "ClusterIssuer" || c.IssuerGroup != "cert-manager.io" {
					t.Errorf("got %+v", c)
				}
			}},
		{name: "no upstream", yaml: "nameConstraints: true\n", wantErr: "exactly one upstream"},
		{name: "two upstreams", yaml: "vault: {address: https://v, tokenFile: /t}\ncertManager: {issuerRef: {name: corp}}\n", wantErr: "exactly one upstream"},
		{name: "vault without auth", yaml: "vault: {address: https://vault:8200}\n", wantErr: "exactly one of a token file"},
		{name: "vault Kubernetes auth without role", yaml: "vault: {address: https://v, kubernetes: {mount: k}}\n", wantErr: "role is required"},
		{name: "cert-manager without issuer", yaml: "certManager: {issuerRef: {kind: Issuer}}\n", wantErr: "issuer name"},
		{name: "cert-manager unknown kind", yaml: "certManager: {issuerRef: {name: x, kind: Vault}}\n", wantErr: "want Issuer or ClusterIssuer"},
		{name: "unknown field", yaml: "vault: {address: https://v, tokenFile: /t, roles: x}\n", wantErr: "unknown field"},
		{name: "negative margin", yaml: "vault: {address: https://v, tokenFile: /t}\nreadyMargin: -1s\n", wantErr: "readyMargin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "upstream.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			u, err := loadUpstream(path, "istio-system")
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
