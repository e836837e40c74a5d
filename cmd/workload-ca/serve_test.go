package main

import (
	"crypto/tls"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/internal/cli"
	"github.com/workload-ca/workload-ca/server"
)

func TestParseServeFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(t *testing.T, c serveOptions)
		wantErr string
		// notWant must not be in the error (internal names).
		notWant string
	}{
		{name: "defaults", args: []string{"--ca-dir", "/ca"}, check: func(t *testing.T, c serveOptions) {
			if c.serving.ListenAddr != ":15012" || c.material.TrustDomain.Name() != "cluster.local" || c.material.DefaultTTL != 24*time.Hour ||
				c.serving.TLSMinVersion != tls.VersionTLS13 || len(c.clusters.NodeAgents) != 1 ||
				c.clusters.NodeAgents[0] != (authz.NodeAgent{Namespace: "istio-system", ServiceAccount: "ztunnel"}) ||
				strings.Join(c.tokens.Audiences, ",") != "istio-ca" || c.podCerts.Enabled || c.podCerts.Workers != 4 {
				t.Fatalf("defaults = %+v", c)
			}
		}},
		{name: "lists and versions", args: []string{"--ca-dir", "/ca", "--node-agents", "a/b, c/d", "--tls-min-version", "1.2", "--serving-dns-names", "x.svc,y.svc"},
			check: func(t *testing.T, c serveOptions) {
				if len(c.clusters.NodeAgents) != 2 || c.serving.TLSMinVersion != tls.VersionTLS12 || len(c.serving.DNSNames) != 2 {
					t.Fatalf("config = %+v", c)
				}
			}},
		{name: "environment fallback", args: []string{"--ca-dir", "/ca"}, env: map[string]string{"WORKLOAD_CA_TRUST_DOMAIN": "example.org", "WORKLOAD_CA_CA_DIR": "/ignored"},
			check: func(t *testing.T, c serveOptions) {
				if c.material.TrustDomain.Name() != "example.org" || c.material.Dir == "/ignored" || c.material.Dir == "" {
					t.Fatalf("env fallback: %+v", c)
				}
			}},
		{name: "a CA source is required", args: nil, wantErr: "exactly one of --ca-dir and --ca-secret"},
		{name: "only one CA source", args: []string{"--ca-dir", "/ca", "--ca-secret", "ns/name"}, wantErr: "exactly one of"},
		{name: "ca secret", args: []string{"--ca-secret", "istio-system/workload-ca"}, check: func(t *testing.T, c serveOptions) {
			if c.material.Secret.Namespace != "istio-system" || c.material.Secret.Name != "workload-ca" {
				t.Fatalf("CASecret = %v", c.material.Secret)
			}
		}},
		{name: "ca secret needs a namespace", args: []string{"--ca-secret", "workload-ca"}, wantErr: "want namespace/name"},
		{name: "plug-in root", args: []string{"--ca-secret", "ns/ca", "--ca-root-dir", "/root-ca"}, check: func(t *testing.T, c serveOptions) {
			if c.material.RootDir != "/root-ca" || c.material.Secret.Name != "ca" || c.material.Dir != "" {
				t.Fatalf("CARootDir %q, CASecret %v, CADir %q", c.material.RootDir, c.material.Secret, c.material.Dir)
			}
		}},
		{name: "plug-in root from the environment", args: []string{"--ca-secret", "ns/ca"}, env: map[string]string{"WORKLOAD_CA_CA_ROOT_DIR": "/root-ca"},
			check: func(t *testing.T, c serveOptions) {
				if c.material.RootDir != "/root-ca" {
					t.Fatalf("CARootDir = %q", c.material.RootDir)
				}
			}},
		{name: "upstream needs ca secret", args: []string{"--ca-dir", "/ca", "--ca-upstream-config", "/up.yaml"}, wantErr: "--ca-upstream-config requires --ca-secret"},
		{name: "upstream or plug-in root, not both", args: []string{"--ca-secret", "ns/ca", "--ca-root-dir", "/root-ca", "--ca-upstream-config", "/up.yaml"}, wantErr: "excludes --ca-root-dir"},
		{name: "upstream config must exist", args: []string{"--ca-secret", "ns/ca", "--ca-upstream-config", "/nonexistent/up.yaml"}, wantErr: "--ca-upstream-config"},
		{name: "plug-in root needs ca secret", args: []string{"--ca-root-dir", "/root-ca"}, wantErr: "--ca-root-dir requires --ca-secret"},
		{name: "plug-in root is not for ca dir", args: []string{"--ca-dir", "/ca", "--ca-root-dir", "/root-ca"}, wantErr: "--ca-root-dir requires --ca-secret"},
		{name: "plug-in root, still one CA source", args: []string{"--ca-dir", "/ca", "--ca-secret", "ns/ca", "--ca-root-dir", "/root-ca"}, wantErr: "exactly one of"},
		{name: "plug-in root, rotation policy still checked", args: []string{"--ca-secret", "ns/ca", "--ca-root-dir", "/root-ca", "--ca-ttl", "48h", "--max-ttl", "47h", "--default-ttl", "1h"}, wantErr: "--ca-ttl 48h0m0s is too short"},
		{name: "rotation policy must leave room for the longest leaf", args: []string{"--ca-secret", "ns/ca", "--ca-ttl", "48h", "--max-ttl", "47h", "--default-ttl", "1h"}, wantErr: "--ca-ttl 48h0m0s is too short"},
		{name: "short fast rotation for tests", args: []string{"--ca-secret", "ns/ca", "--ca-ttl", "60s", "--max-ttl", "10s", "--default-ttl", "10s", "--rotation-propagation-delay", "5s"}, check: func(t *testing.T, c serveOptions) {
			p, err := c.material.RotationPolicy()
			if err != nil || p.CATTL != time.Minute || p.LeafMaxTTL != 10*time.Second {
				t.Fatalf("policy = %+v, %v", p, err)
			}
		}},
		{name: "rotation skew margin", args: []string{"--ca-secret", "ns/ca", "--ca-ttl", "60s", "--max-ttl", "8s", "--default-ttl", "8s", "--rotation-propagation-delay", "4s", "--rotation-skew-margin", "2s"}, check: func(t *testing.T, c serveOptions) {
			p, err := c.material.RotationPolicy()
			if err != nil || p.SkewMargin != 2*time.Second {
				t.Fatalf("policy = %+v, %v", p, err)
			}
		}},
		{name: "rotation skew margin must be positive", args: []string{"--ca-secret", "ns/ca", "--rotation-skew-margin", "0s"}, wantErr: "--rotation-skew-margin"},
		{name: "key in a KMS for ca dir", args: []string{"--ca-dir", "/ca", "--ca-key-uri", "awskms:key-id=k1;region=eu-west-1"}, check: func(t *testing.T, c serveOptions) {
			if c.material.KeyURI != "awskms:key-id=k1;region=eu-west-1" {
				t.Errorf("CAKeyURI = %q", c.material.KeyURI)
			}
		}},
		{name: "a KMS key signing leaves: signing slots not bound to the CPUs", args: []string{"--ca-dir", "/ca", "--ca-key-uri", "awskms:key-id=k1"}, check: func(t *testing.T, c serveOptions) {
			if c.serving.MaxConcurrentSigns != server.KMSConcurrentSigns {
				t.Errorf("MaxConcurrentSigns = %d, want %d", c.serving.MaxConcurrentSigns, server.KMSConcurrentSigns)
			}
		}},
		{name: "a key file through softkms: signing slots per CPU", args: []string{"--ca-dir", "/ca", "--ca-key-uri", "softkms:path=/k.pem"}, check: func(t *testing.T, c serveOptions) {
			if c.serving.MaxConcurrentSigns != 0 {
				t.Errorf("MaxConcurrentSigns = %d, want 0 (the server's per-CPU default)", c.serving.MaxConcurrentSigns)
			}
		}},
		{name: "an explicit signing slot count wins over the KMS default", args: []string{"--ca-dir", "/ca", "--ca-key-uri", "awskms:key-id=k1", "--max-concurrent-signs", "8"}, check: func(t *testing.T, c serveOptions) {
			if c.serving.MaxConcurrentSigns != 8 {
				t.Errorf("MaxConcurrentSigns = %d, want 8", c.serving.MaxConcurrentSigns)
			}
		}},
		{name: "key in a KMS for a plug-in root", args: []string{"--ca-secret", "ns/ca", "--ca-root-dir", "/root-ca", "--ca-key-uri", "pkcs11:token=ca;id=01?pin-source=/run/pin"}, check: func(t *testing.T, c serveOptions) {
			if c.material.KeyURI == "" || c.material.RootDir != "/root-ca" {
				t.Errorf("CAKeyURI %q, CARootDir %q", c.material.KeyURI, c.material.RootDir)
			}
		}},
		{name: "key URI needs the directory of its certificate", args: []string{"--ca-secret", "ns/ca", "--ca-key-uri", "awskms:key-id=k1"}, wantErr: "--ca-key-uri requires --ca-dir or --ca-root-dir"},
		{name: "key URI must be a URI", args: []string{"--ca-dir", "/ca", "--ca-key-uri", "/etc/ca/key.pem"}, wantErr: "--ca-key-uri"},
		{name: "bad trust domain", args: []string{"--ca-dir", "/ca", "--trust-domain", "Not A Domain"}, wantErr: "--trust-domain"},
		{name: "bad node agent", args: []string{"--ca-dir", "/ca", "--node-agents", "ztunnel"}, wantErr: "--node-agents"},
		{name: "default ttl over max", args: []string{"--ca-dir", "/ca", "--default-ttl", "48h", "--max-ttl", "24h"}, wantErr: "--default-ttl"},
		{name: "bad tls version", args: []string{"--ca-dir", "/ca", "--tls-min-version", "1.1"}, wantErr: "--tls-min-version"},
		{name: "pod certificate workers", args: []string{"--ca-dir", "/ca", "--pod-certificates", "--pod-certificate-workers", "8"}, check: func(t *testing.T, c serveOptions) {
			if !c.podCerts.Enabled || c.podCerts.Workers != 8 {
				t.Errorf("PodCertificates %v, PodCertWorkers %d", c.podCerts.Enabled, c.podCerts.Workers)
			}
		}},
		{name: "pod certificates need a max ttl of an hour", args: []string{"--ca-dir", "/ca", "--pod-certificates", "--max-ttl", "30m", "--default-ttl", "10m"}, wantErr: "--pod-certificates: --max-ttl"},
		{name: "at least one pod certificate worker", args: []string{"--ca-dir", "/ca", "--pod-certificate-workers", "0"}, wantErr: "--pod-certificate-workers"},
		{name: "a word after a boolean flag is refused, not the rest dropped", args: []string{"--ca-dir", "/ca", "--pprof", "false", "--max-ttl", "1h"}, wantErr: "unexpected arguments"},
		{name: "renew deadline within client-go's jitter of the retry period", args: []string{"--ca-dir", "/ca", "--leader-election-renew-deadline", "10s", "--leader-election-retry-period", "9s"}, wantErr: "leader election"},
		{name: "renew deadline past the jittered retry period", args: []string{"--ca-dir", "/ca", "--leader-election-renew-deadline", "10s", "--leader-election-retry-period", "8s"}, check: func(t *testing.T, c serveOptions) {
			if c.process.Leader.Durations.Renew != 10*time.Second || c.process.Leader.Durations.Retry != 8*time.Second {
				t.Errorf("lease %+v", c.process.Leader.Durations)
			}
		}},
		{name: "no audiences", args: []string{"--ca-dir", "/ca", "--token-audiences", ""}, wantErr: "--token-audiences"},
		{name: "all problems reported at once", args: []string{"--tls-min-version", "1.0", "--log-level", "loud"}, wantErr: "--log-level"},
		{name: "a missing ca dir is not created unasked", args: []string{"--ca-dir", "/ca/absent"}, wantErr: "absent does not exist (a mistyped path?)"},
		{name: "a missing ca dir created when asked", args: []string{"--ca-dir", "/ca/absent", "--ca-dir-create"}, check: func(t *testing.T, c serveOptions) {
			if !c.material.DirCreate {
				t.Error("CADirCreate not set")
			}
		}},
		{name: "a ca dir that is a file", args: []string{"--ca-dir", "/ca/file"}, wantErr: "is not a directory"},
		{name: "text logs", args: []string{"--ca-dir", "/ca", "--log-format", "text"}, check: func(t *testing.T, c serveOptions) {
			if !c.process.LogText {
				t.Error("LogText not set")
			}
		}},
		{name: "an unknown log format", args: []string{"--ca-dir", "/ca", "--log-format", "xml"}, wantErr: "--log-format"},
		{name: "a duration without a unit names the flag and an example", args: []string{"--ca-dir", "/ca", "--default-ttl", "5"}, wantErr: "--default-ttl wants a duration, e.g. --default-ttl=24h)"},
		{name: "a number that is not one", args: []string{"--ca-dir", "/ca", "--max-streams-per-connection", "x"}, wantErr: "--max-streams-per-connection wants a whole number"},
		{name: "remote clusters", args: []string{"--ca-dir", "/ca", "--cluster-id", "A", "--remote-cluster-secrets", "--remote-kubeconfigs", "B=/b.kubeconfig, C=/c.kubeconfig"},
			check: func(t *testing.T, c serveOptions) {
				if !c.clusters.RemoteSecrets || c.clusters.RemoteSecretsNS != "istio-system" || len(c.clusters.RemoteKubeconfigs) != 2 || c.clusters.RemoteKubeconfigs["C"] != "/c.kubeconfig" {
					t.Fatalf("remote clusters: secrets %v in %q, files %v", c.clusters.RemoteSecrets, c.clusters.RemoteSecretsNS, c.clusters.RemoteKubeconfigs)
				}
			}},
		{name: "remote clusters need the local cluster's id", args: []string{"--ca-dir", "/ca", "--remote-cluster-secrets"}, wantErr: "need --cluster-id"},
		{name: "a remote cluster with the local id", args: []string{"--ca-dir", "/ca", "--cluster-id", "A", "--remote-kubeconfigs", "A=/a"}, wantErr: "is this CA's own --cluster-id"},
		{name: "a remote cluster without its file", args: []string{"--ca-dir", "/ca", "--cluster-id", "A", "--remote-kubeconfigs", "B"}, wantErr: "want cluster-id=kubeconfig-file"},
		{name: "a key type no generator makes", args: []string{"--ca-dir", "/ca", "--ca-key-type", "ed25519"}, wantErr: `--ca-key-type: unknown key type "ed25519"`},
		{name: "a KMS nobody knows", args: []string{"--ca-dir", "/ca", "--ca-key-uri", "bogus:foo"}, wantErr: `--ca-key-uri: unknown KMS "bogus"`},
		{name: "istiod's certificate in a namespace that cannot be one", args: []string{"--ca-dir", "/ca", "--istiod-cert", "--istiod-namespace", "Istio System"}, wantErr: `--istiod-namespace, --istiod-cert-secret or --istiod-cert-dns-names: namespace "Istio System"`},
		{name: "istiod's certificate for a name that is not one", args: []string{"--ca-dir", "/ca", "--istiod-cert", "--istiod-cert-dns-names", "istiod..svc"}, wantErr: `DNS name "istiod..svc"`},
		{name: "istiod's certificate with no lifetime", args: []string{"--ca-dir", "/ca", "--istiod-cert", "--istiod-cert-ttl", "0s"}, wantErr: "--istiod-cert-ttl 0s must be positive"},
		{name: "istiod's names are not checked unless asked for", args: []string{"--ca-dir", "/ca", "--istiod-namespace", "Istio System"}, check: func(t *testing.T, c serveOptions) {
			if c.istiod.Enabled {
				t.Error("IstiodCert set without --istiod-cert")
			}
		}},
		{name: "istiod's certificate with its names", args: []string{"--ca-dir", "/ca", "--istiod-cert", "--istiod-cert-dns-names", "istiod.istio-system.svc, istiod-canary.istio-system.svc"}, check: func(t *testing.T, c serveOptions) {
			if !c.istiod.Enabled || c.istiod.Namespace != "istio-system" || c.istiod.SecretName != "istiod-tls" ||
				!slices.Equal([]string(c.istiod.DNSNames), []string{"istiod.istio-system.svc", "istiod-canary.istio-system.svc"}) || c.istiod.TTL != 24*time.Hour {
				t.Errorf("istiod settings %v %q %q %q %v", c.istiod.Enabled, c.istiod.Namespace, c.istiod.SecretName, c.istiod.DNSNames, c.istiod.TTL)
			}
		}},
		{name: "a CA lifetime too short for rotation says which flags and how long", args: []string{"--ca-secret", "ns/ca", "--ca-ttl", "1h"}, wantErr: "--ca-ttl 1h0m0s is too short", notWant: "CATTL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			// "/ca" is an existing directory; "/ca/file" a file in it.
			caDir := t.TempDir()
			if err := os.WriteFile(filepath.Join(caDir, "file"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			args := slices.Clone(tt.args)
			for i, a := range args {
				if a == "/ca" || strings.HasPrefix(a, "/ca/") {
					args[i] = caDir + strings.TrimPrefix(a, "/ca")
				}
			}
			c, err := parseServeFlags(args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseServeFlags() error = %v, want usage error mentioning %q", err, tt.wantErr)
				}
				if tt.notWant != "" && strings.Contains(err.Error(), tt.notWant) {
					t.Fatalf("parseServeFlags() error = %v, mentions %q", err, tt.notWant)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

// TestServeUsageErrorIsOneLine: a bad value exits 2 with one line naming
// the flag, not the usage of every flag.
func TestServeUsageErrorIsOneLine(t *testing.T) {
	var stdout, stderr strings.Builder
	code := run(t.Context(), []string{"serve", "--ca-dir", t.TempDir(), "--default-ttl", "5"}, &stdout, &stderr)
	if code != 2 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "--default-ttl") {
		t.Fatalf("exit %d, stderr %q; want 2 and one line naming --default-ttl", code, stderr.String())
	}
}
