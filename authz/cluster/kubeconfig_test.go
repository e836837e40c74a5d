package cluster_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/workload-ca/workload-ca/authz/cluster"
	"github.com/workload-ca/workload-ca/internal/testlog"
)

// apiServer is a loopback HTTPS listener standing for a remote API server
// that records the Authorization header of every request.
type apiServer struct {
	*httptest.Server
	mu    sync.Mutex
	auths []string
}

func newAPIServer(t *testing.T) *apiServer {
	t.Helper()
	s := &apiServer{}
	s.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.auths = append(s.auths, r.Header.Get("Authorization"))
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"major":"1","minor":"35","gitVersion":"v1.35.0"}`)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *apiServer) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.auths...)
}

func (s *apiServer) caData() string {
	return base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}))
}

// kubeconfigWith is a kubeconfig of one cluster, user and context, with
// the given extra lines of the cluster and the user.
func kubeconfigWith(server, caData, cluster, user string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: %s
    certificate-authority-data: %s
%s
users:
- name: u
  user:
%s
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, server, caData, indent(cluster), indent(user))
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n    ")
}

// remotesReaching is a Remotes whose Build makes one request to the
// remote API server with the configuration it is given, as the cluster's
// first JWKS fetch would, and is running.
func remotesReaching(t *testing.T, obs *readiness) *cluster.Remotes {
	t.Helper()
	r, err := cluster.NewRemotes(cluster.RemotesConfig{Local: "A", Observer: obs, Logger: testlog.New(t),
		Build: func(id string, cfg *rest.Config) (*cluster.Cluster, error) {
			cfg.Timeout = 10 * time.Second
			k, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return nil, err
			}
			_, _ = k.Discovery().ServerVersion()
			c := fake.NewClientset()
			return cluster.New(cluster.Config{ID: id, Clients: cluster.Clients{Reviews: c, Pods: c, Accounts: c},
				TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local")})
		}})
	if err != nil {
		t.Fatal(err)
	}
	// A cluster whose server refuses connections tells when Run runs.
	r.Set("probe", cluster.Trusted, map[string][]byte{"probe": kubeconfig("https://127.0.0.1:1")})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	waitFor(t, "Run", func() bool { _, ok := r.Cluster("probe"); return ok })
	r.Set("probe", cluster.Trusted, nil)
	return r
}

// execPlugin is a user entry naming a credential plugin that writes
// marker when run, and the marker's path.
func execPlugin(t *testing.T) (user, marker string) {
	t.Helper()
	dir := t.TempDir()
	marker = filepath.Join(dir, "ran")
	script := filepath.Join(dir, "plugin.sh")
	body := "#!/bin/sh\ntouch " + marker + "\n" +
		`echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"from-plugin"}}'` + "\n"
	if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
		t.Fatal(err)
	}
	return "exec:\n  apiVersion: client.authentication.k8s.io/v1\n  command: " + script + "\n  interactiveMode: Never", marker
}

// TestSecretKubeconfigRefusesExecPlugin: a Secret's kubeconfig naming an
// exec credential plugin configures nothing, and the plugin never runs;
// the operator's own kubeconfig file may still use one (which shows the
// plugin would have run: it did before this check).
func TestSecretKubeconfigRefusesExecPlugin(t *testing.T) {
	srv := newAPIServer(t)
	user, marker := execPlugin(t)
	kc := kubeconfigWith(srv.URL, srv.caData(), "", user)
	obs := &readiness{}
	r := remotesReaching(t, obs)

	r.Set("secret hostile", cluster.Untrusted, map[string][]byte{"B": kc})
	if _, ok := r.Cluster("B"); ok {
		t.Error("the cluster of a kubeconfig with an exec plugin was added")
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the exec plugin of a Secret's kubeconfig ran inside the CA")
	}
	if got := srv.seen(); len(got) != 0 {
		t.Errorf("the remote server was reached: %q", got)
	}
	if got := obs.refusals()["exec"]; got != 1 {
		t.Errorf("refusals for exec = %d, want 1", got)
	}

	r.Set("--remote-kubeconfigs", cluster.Trusted, map[string][]byte{"C": kc})
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the operator's kubeconfig's plugin did not run: %v", err)
	}
	if _, ok := r.Cluster("C"); !ok {
		t.Error("the operator's kubeconfig with an exec plugin was refused")
	}
}

// TestSecretKubeconfigRefusesTokenFile: a Secret's kubeconfig naming a
// token file (the CA's own service account token, say) configures
// nothing and the file's token is sent nowhere; from the operator's file
// it is sent, as it was from a Secret before this check.
func TestSecretKubeconfigRefusesTokenFile(t *testing.T) {
	srv := newAPIServer(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("the-cas-own-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	kc := kubeconfigWith(srv.URL, srv.caData(), "", "tokenFile: "+tokenFile)
	obs := &readiness{}
	r := remotesReaching(t, obs)

	r.Set("secret hostile", cluster.Untrusted, map[string][]byte{"B": kc})
	if _, ok := r.Cluster("B"); ok {
		t.Error("the cluster of a kubeconfig with a tokenFile was added")
	}
	if got := srv.seen(); len(got) != 0 {
		t.Fatalf("the token file's token went to the kubeconfig's server: %q", got)
	}
	if got := obs.refusals()["file"]; got != 1 {
		t.Errorf("refusals for file = %d, want 1", got)
	}

	r.Set("--remote-kubeconfigs", cluster.Trusted, map[string][]byte{"C": kc})
	if got := srv.seen(); len(got) != 1 || got[0] != "Bearer the-cas-own-token" {
		t.Errorf("the operator's kubeconfig's token file: the server saw %q", got)
	}
}

// TestSecretKubeconfigRefusedOnce: a Secret that comes again unchanged (a
// resync) is neither checked nor counted again; a good kubeconfig next to
// a refused one in the same Secret is added.
func TestSecretKubeconfigRefusedOnce(t *testing.T) {
	srv := newAPIServer(t)
	user, _ := execPlugin(t)
	obs := &readiness{}
	r := remotesReaching(t, obs)
	data := map[string][]byte{
		"B": kubeconfigWith(srv.URL, srv.caData(), "", user),
		"C": kubeconfigWith(srv.URL, srv.caData(), "", "token: good"),
	}
	r.Set("secret s", cluster.Untrusted, data)
	r.Set("secret s", cluster.Untrusted, data)
	if got := obs.refusals()["exec"]; got != 1 {
		t.Errorf("refusals for exec = %d, want 1", got)
	}
	if _, ok := r.Cluster("C"); !ok {
		t.Error("the good kubeconfig next to a refused one was not added")
	}
	if got := srv.seen(); len(got) != 1 || got[0] != "Bearer good" {
		t.Errorf("the server saw %q, want the good token once", got)
	}
}

// refused checks that CheckKubeconfig refuses kc for reason.
func refused(t *testing.T, kc []byte, reason cluster.Reason) {
	t.Helper()
	cfg, err := cluster.CheckKubeconfig(kc)
	if err == nil {
		t.Fatalf("accepted: host %q", cfg.Host)
	}
	if got := cluster.ReasonOf(err); got != reason {
		t.Errorf("reason %q (%v), want %q", got, err, reason)
	}
}

func TestSecretKubeconfigRefusesProxyURL(t *testing.T) {
	srv := newAPIServer(t)
	refused(t, kubeconfigWith(srv.URL, srv.caData(), "proxy-url: http://attacker:3128", "token: t"), cluster.ReasonProxy)
}

func TestSecretKubeconfigRefusesInsecureSkipTLS(t *testing.T) {
	srv := newAPIServer(t)
	refused(t, kubeconfigWith(srv.URL, srv.caData(), "insecure-skip-tls-verify: true", "token: t"), cluster.ReasonInsecure)
}

func TestSecretKubeconfigRefusesHTTPServer(t *testing.T) {
	srv := newAPIServer(t)
	refused(t, kubeconfigWith(strings.Replace(srv.URL, "https:", "http:", 1), srv.caData(), "", "token: t"), cluster.ReasonNotHTTPS)
}

func TestSecretKubeconfigRefusesOversizedKubeconfig(t *testing.T) {
	srv := newAPIServer(t)
	kc := kubeconfigWith(srv.URL, srv.caData(), "", "token: "+strings.Repeat("x", cluster.MaxKubeconfigBytes))
	refused(t, kc, cluster.ReasonTooLarge)
}

// TestSecretKubeconfigRefuses: everything else a Secret's kubeconfig may
// not carry, in any entry, used or not.
func TestSecretKubeconfigRefuses(t *testing.T) {
	srv := newAPIServer(t)
	ca := srv.caData()
	certPEM, keyPEM := clientCert(t)
	b64 := base64.StdEncoding.EncodeToString
	for _, tc := range []struct {
		name   string
		kc     []byte
		reason cluster.Reason
	}{
		{"CertificateAuthorityFile", kubeconfigWith(srv.URL, ca, "certificate-authority: /etc/ssl/ca.pem", "token: t"), cluster.ReasonFile},
		{"ClientCertificateFile", kubeconfigWith(srv.URL, ca, "", "client-certificate: /c.pem\nclient-key-data: "+b64(keyPEM)), cluster.ReasonFile},
		{"ClientKeyFile", kubeconfigWith(srv.URL, ca, "", "client-certificate-data: "+b64(certPEM)+"\nclient-key: /k.pem"), cluster.ReasonFile},
		{"AuthProviderOIDC", kubeconfigWith(srv.URL, ca, "", "token: t\nauth-provider: {name: oidc, config: {idp-issuer-url: https://x}}"), cluster.ReasonAuthProvider},
		{"AuthProviderGCP", kubeconfigWith(srv.URL, ca, "", "auth-provider: {name: gcp}"), cluster.ReasonAuthProvider},
		{"Impersonation", kubeconfigWith(srv.URL, ca, "", "token: t\nas: system:admin"), cluster.ReasonImpersonation},
		{"ImpersonatedGroups", kubeconfigWith(srv.URL, ca, "", "token: t\nas-groups: [system:masters]"), cluster.ReasonImpersonation},
		{"BasicAuth", kubeconfigWith(srv.URL, ca, "", "username: a\npassword: b"), cluster.ReasonBasicAuth},
		{"NoCredential", kubeconfigWith(srv.URL, ca, "", "{}"), cluster.ReasonNoCredential},
		{"CertificateWithoutKey", kubeconfigWith(srv.URL, ca, "", "client-certificate-data: "+b64(certPEM)), cluster.ReasonNoCredential},
		{"NoCA", kubeconfigWith(srv.URL, "", "", "token: t"), cluster.ReasonNoCA},
		{"CAThatIsNotACertificate", kubeconfigWith(srv.URL, b64(keyPEM), "", "token: t"), cluster.ReasonNoCA},
		{"UserInServerURL", kubeconfigWith("https://a:b@"+srv.Listener.Addr().String(), ca, "", "token: t"), cluster.ReasonInvalid},
		{"NotYAML", []byte("{"), cluster.ReasonInvalid},
		{"Empty", nil, cluster.ReasonInvalid},
		{"NoCurrentContextOfTwo", []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: ` + srv.URL + `, certificate-authority-data: ` + ca + `}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}, {name: d, context: {cluster: c, user: u}}]
`), cluster.ReasonContext},
		{"CurrentContextMissing", []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: ` + srv.URL + `, certificate-authority-data: ` + ca + `}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: elsewhere
`), cluster.ReasonContext},
		{"UnusedUserWithExecPlugin", []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: ` + srv.URL + `, certificate-authority-data: ` + ca + `}}]
users:
- {name: u, user: {token: t}}
- {name: other, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/true, interactiveMode: Never}}}
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), cluster.ReasonExec},
		{"UnusedClusterWithProxy", []byte(`apiVersion: v1
kind: Config
clusters:
- {name: c, cluster: {server: ` + srv.URL + `, certificate-authority-data: ` + ca + `}}
- {name: d, cluster: {server: ` + srv.URL + `, certificate-authority-data: ` + ca + `, proxy-url: "http://p:1"}}
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), cluster.ReasonProxy},
	} {
		t.Run(tc.name, func(t *testing.T) { refused(t, tc.kc, tc.reason) })
	}
}

// TestSecretKubeconfigAcceptsInlineToken: the kubeconfig istioctl
// create-remote-secret writes works, its token sent to its server only.
func TestSecretKubeconfigAcceptsInlineToken(t *testing.T) {
	srv := newAPIServer(t)
	cfg, err := cluster.CheckKubeconfig(kubeconfigWith(srv.URL, srv.caData(), "tls-server-name: example.com\ndisable-compression: true", "token: inline"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != srv.URL || cfg.BearerToken != "inline" || cfg.ServerName != "example.com" || !cfg.DisableCompression {
		t.Errorf("config: host %q, server name %q, compression off %v", cfg.Host, cfg.ServerName, cfg.DisableCompression)
	}
	cfg.ServerName = "" // the test server's certificate names example.com, but let it be
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	if got := srv.seen(); len(got) != 1 || got[0] != "Bearer inline" {
		t.Errorf("the server saw %q", got)
	}
}

// TestSecretKubeconfigAcceptsInlineClientCert: a client certificate and
// key inline authenticate to a server that requires one.
func TestSecretKubeconfigAcceptsInlineClientCert(t *testing.T) {
	var gotCert sync.Map
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) > 0 {
			gotCert.Store("cn", r.TLS.PeerCertificates[0].Subject.CommonName)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"major":"1","minor":"35"}`)
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()
	certPEM, keyPEM := clientCert(t)
	b64 := base64.StdEncoding.EncodeToString
	ca := b64(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	cfg, err := cluster.CheckKubeconfig(kubeconfigWith(srv.URL, ca, "", "client-certificate-data: "+b64(certPEM)+"\nclient-key-data: "+b64(keyPEM)))
	if err != nil {
		t.Fatal(err)
	}
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	if cn, _ := gotCert.Load("cn"); cn != "remote-ca-client" {
		t.Errorf("the server saw client certificate %v", cn)
	}
}

// TestSecretKubeconfigIgnoresEnvironment: the check reads neither
// $KUBECONFIG nor ~/.kube/config, even when the Secret's kubeconfig names
// no current context of its own.
func TestSecretKubeconfigIgnoresEnvironment(t *testing.T) {
	srv := newAPIServer(t)
	hostile := kubeconfigWith("https://attacker.example:443", srv.caData(), "", "token: from-env")
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, ".kube"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "env"), filepath.Join(dir, ".kube", "config")} {
		if err := os.WriteFile(p, hostile, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("KUBECONFIG", filepath.Join(dir, "env"))
	t.Setenv("HOME", dir)
	cfg, err := cluster.CheckKubeconfig(kubeconfigWith(srv.URL, srv.caData(), "", "token: own"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != srv.URL || cfg.BearerToken != "own" {
		t.Errorf("config from the environment: host %q", cfg.Host)
	}
	refused(t, []byte("apiVersion: v1\nkind: Config\n"), cluster.ReasonContext)
}

// FuzzCheckKubeconfig: the check never panics, and what it accepts names
// no file, command, proxy or impersonation and speaks https with a CA.
func FuzzCheckKubeconfig(f *testing.F) {
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: selfSigned(f).Raw}))
	f.Add(kubeconfigWith("https://10.0.0.1:6443", ca, "", "token: t"))
	f.Add(kubeconfigWith("https://10.0.0.1:6443", ca, "", "tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"))
	f.Add(kubeconfigWith("https://10.0.0.1:6443", ca, "proxy-url: http://p", "exec: {command: /bin/sh}"))
	f.Add(kubeconfigWith("http://10.0.0.1", ca, "insecure-skip-tls-verify: true", "as: admin"))
	f.Add([]byte(`{"apiVersion":"v1","kind":"Config","clusters":[{"name":"c","cluster":{"server":"https://x"}}]}`))
	f.Fuzz(func(t *testing.T, kc []byte) {
		cfg, err := cluster.CheckKubeconfig(kc)
		if err != nil {
			if cfg != nil {
				t.Fatal("a refusal with a config")
			}
			return
		}
		switch {
		case !strings.HasPrefix(cfg.Host, "https://"):
			t.Fatalf("host %q", cfg.Host)
		case cfg.BearerTokenFile != "" || cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "":
			t.Fatal("a file")
		case cfg.ExecProvider != nil || cfg.AuthProvider != nil || cfg.Proxy != nil || cfg.Insecure:
			t.Fatal("a plugin, proxy or insecure")
		case cfg.Impersonate.UserName != "" || len(cfg.Impersonate.Groups) > 0 || cfg.Username != "" || cfg.Password != "":
			t.Fatal("impersonation or basic auth")
		case len(cfg.CAData) == 0 || (cfg.BearerToken == "" && len(cfg.CertData) == 0):
			t.Fatal("no CA or no credential")
		}
	})
}

func selfSigned(tb testing.TB) *x509.Certificate {
	tb.Helper()
	c, _ := certAndKey(tb)
	return c
}

func certAndKey(tb testing.TB) (*x509.Certificate, *ecdsa.PrivateKey) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, BasicConstraintsValid: true, IsCA: true}
	tmpl.Subject.CommonName = "remote-ca-client"
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return c, key
}

// clientCert is a client certificate and its key, PEM.
func clientCert(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	c, key := certAndKey(t)
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}
