package e2e_test

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
)

// remoteClusterRules are what a CA needs of a remote cluster, as the
// chart's remote mode grants them: TokenReviews, and the pods and service
// accounts to index.
var remoteClusterRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, Verbs: []string{"list", "watch"}},
}

// TestMultiCluster runs two real control planes, A (the CA's own) and B
// (remote, each with its own etcd and service account signing key), and a
// CA in A that serves B's ztunnels from a remote Secret: each cluster's
// tokens, pods and nodes decide only for that cluster's callers. Both
// clusters have a node named node-a, with different pods on it.
func TestMultiCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	const ns, mesh = "demo", "istio-system"
	a := ownControlPlane(ctx, t, dir+"/a", mesh, ns)
	b := ownControlPlane(ctx, t, dir+"/b", mesh, ns)
	pod := func(cp *controlplane.ControlPlane, ns, name, sa, node string) *corev1.Pod {
		t.Helper()
		if _, err := cp.CreateServiceAccount(ctx, ns, sa); err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatal(err)
		}
		p, err := cp.CreatePod(ctx, ns, name, sa, node)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, n := range []string{"node-a", "node-b"} {
		for _, cp := range []*controlplane.ControlPlane{a, b} {
			if _, err := cp.CreateNode(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
	}
	ztA := pod(a, mesh, "ztunnel-a", "ztunnel", "node-a")
	pod(a, ns, "api-0", "api", "node-a") // api runs in A only
	ztB := pod(b, mesh, "ztunnel-b", "ztunnel", "node-a")
	pod(b, ns, "web-0", "web", "node-a")
	gone := pod(b, ns, "cache-0", "cache", "node-a")
	pod(b, ns, "db-0", "db", "node-b")
	token := func(cp *controlplane.ControlPlane, p *corev1.Pod) string {
		t.Helper()
		tok, err := cp.PodToken(ctx, p.Namespace, p.Spec.ServiceAccountName, p, audience, 3600)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	tokA, tokB := token(a, ztA), token(b, ztB)
	// A token of B only B's API server can answer for: bound to a Secret,
	// never cached.
	secret, err := b.Client().CoreV1().Secrets(mesh).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bound"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secretTokB, err := b.BoundToken(ctx, mesh, "ztunnel", "Secret", secret.Name, secret.UID, audience, 3600)
	if err != nil {
		t.Fatal(err)
	}

	// B's side, as docs/multi-cluster.md says: the chart in remote mode
	// (a service account with the remote rules), and a kubeconfig with its
	// token for A's Secret.
	s := suiteFor(t)
	remoteSA := ""
	ap := newApplier(t, b.RESTConfig())
	for _, o := range renderChart(t, helmBinary(t), "wca", mesh, serverVersion(t, s), "ci/remote-values.yaml") {
		if _, err := ap.apply(ctx, o, false); err != nil {
			t.Fatalf("apply %s to B: %v", objName(o), err)
		}
		if o.GetKind() == "ServiceAccount" {
			remoteSA = o.GetName()
		}
	}
	remoteKubeconfig := remoteKubeconfigOf(t, b, mesh, remoteSA)
	remoteSecret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-remote-secret-b", Namespace: mesh, Labels: map[string]string{"istio/multiCluster": "true"}},
		Data:       map[string][]byte{"B": remoteKubeconfig},
	}
	secrets := a.Client().CoreV1().Secrets(mesh)
	if _, err := secrets.Create(ctx, remoteSecret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	ca, err := cahost.Start(ctx, cahost.Options{Kubeconfig: a.KubeconfigPath(), WorkDir: dir + "/ca",
		ExtraArgs: []string{"--ca-dir-create", "--cluster-id", "A", "--remote-cluster-secrets", "--publish-trust-bundle=false"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("CA log (last 60 lines):\n%s", lastLines(ca.Logs(), 60))
		}
		if err := ca.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	cfg, err := ca.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	client, err := caclient.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ask := func(token, cluster, identity string) codes.Code {
		t.Helper()
		rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
		defer rcancel()
		req := caclient.Request{Token: token, ClusterID: cluster}
		if identity != "" {
			req.Identity, req.Impersonate = spiffeid.RequireFromString(identity), true
		} else {
			own, err := ownIdentity(token)
			if err != nil {
				t.Fatal(err)
			}
			req.Identity = own
		}
		_, err := client.CreateCertificate(rctx, req)
		return status.Code(err)
	}
	until := func(what string, want codes.Code, within time.Duration, f func() codes.Code) time.Duration {
		t.Helper()
		began := time.Now()
		var got codes.Code
		for time.Since(began) < within {
			if got = f(); got == want {
				return time.Since(began)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("%s: still %s after %v, want %s", what, got, within, want)
		return 0
	}
	web, db, api, cache := id(ns, "web"), id(ns, "db"), id(ns, "api"), id(ns, "cache")
	took := until("B's ztunnel once B is indexed", codes.OK, 30*time.Second, func() codes.Code { return ask(tokB, "B", web) })
	t.Logf("B served %v after the CA was serving", took.Round(time.Millisecond))

	for _, c := range []struct {
		name           string
		token, cluster string
		identity       string
		want           codes.Code
	}{
		{"B's ztunnel gets a pod of its node in B", tokB, "B", web, codes.OK},
		{"B's ztunnel gets its own identity", tokB, "B", "", codes.OK},
		{"B's ztunnel is denied B's pods on another node", tokB, "B", db, codes.PermissionDenied},
		{"B's ztunnel is denied a pod on node-a of A", tokB, "B", api, codes.PermissionDenied},
		{"A's ztunnel gets A's pods on its node", tokA, "A", api, codes.OK},
		{"A's ztunnel is denied B's pod on node-a of B", tokA, "A", web, codes.PermissionDenied},
		{"A's token presented as B's is refused", tokA, "B", api, codes.Unauthenticated},
		{"B's token presented as A's is refused", tokB, "A", web, codes.Unauthenticated},
		{"B's token with Istio's default clusterid is refused", tokB, "Kubernetes", web, codes.Unauthenticated},
		{"a cluster neither A nor B is refused", tokB, "C", web, codes.Unauthenticated},
	} {
		if got := ask(c.token, c.cluster, c.identity); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}

	t.Run("a pod deleted in B stops authorizing B's ztunnel", func(t *testing.T) {
		if got := ask(tokB, "B", cache); got != codes.OK {
			t.Fatalf("before the delete: %s", got)
		}
		zero := int64(0)
		if err := b.Client().CoreV1().Pods(ns).Delete(ctx, gone.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		took := until("cache after its only pod was deleted in B", codes.PermissionDenied, 10*time.Second, func() codes.Code { return ask(tokB, "B", cache) })
		t.Logf("denied %v after the delete", took.Round(time.Millisecond))
	})

	t.Run("metrics and audit name the cluster", func(t *testing.T) {
		metrics := scrape(t, ca)
		for _, want := range []string{`workload_ca_remote_cluster_ready{cluster="B"} 1`,
			`workload_ca_cluster_requests_total{cluster="B",result="issued"}`, `workload_ca_cluster_requests_total{cluster="A",result="issued"}`} {
			if !strings.Contains(metrics, want) {
				t.Errorf("/metrics lacks %s:\n%s", want, grepLines(metrics, "cluster", 20))
			}
		}
		if lines := logLines(ca, `"cluster":"B"`); len(lines) == 0 || !strings.Contains(strings.Join(lines, "\n"), `"msg":"certificate issued"`) {
			t.Errorf("no audit record of an issuance names cluster B")
		}
	})

	t.Run("a hostile remote Secret: no command run, no token sent, its clusters refused, B unaffected", func(t *testing.T) {
		hostileRemoteSecret(ctx, t, secrets, mesh, func(id string) codes.Code { return ask(tokB, id, web) }, func() string { return scrape(t, ca) })
		if got := ask(tokB, "B", web); got != codes.OK {
			t.Errorf("B next to the hostile Secret: %s", got)
		}
	})

	t.Run("the remote Secret deleted: B refused within seconds, A unaffected; added back: B again", func(t *testing.T) {
		if err := secrets.Delete(ctx, remoteSecret.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		took := until("B after its Secret was deleted", codes.Unauthenticated, 10*time.Second, func() codes.Code { return ask(tokB, "B", web) })
		t.Logf("B refused %v after the delete", took.Round(time.Millisecond))
		if got := ask(tokA, "A", api); got != codes.OK {
			t.Errorf("A without B: %s", got)
		}
		remoteSecret.ResourceVersion = ""
		if _, err := secrets.Create(ctx, remoteSecret, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		took = until("B after its Secret was created again", codes.OK, 30*time.Second, func() codes.Code { return ask(tokB, "B", web) })
		t.Logf("B served again %v after the Secret came back, no restart", took.Round(time.Millisecond))
	})

	t.Run("B's API server stopped: B's unknown tokens fail closed, A keeps issuing", func(t *testing.T) {
		if got := ask(secretTokB, "B", ""); got != codes.OK {
			t.Fatalf("before the stop, B's Secret-bound token: %s", got)
		}
		if err := b.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		if got := ask(secretTokB, "B", ""); got != codes.Unavailable {
			t.Errorf("B's Secret-bound token with B's API server down: %s, want Unavailable", got)
		}
		t.Logf("refused after %v", time.Since(began).Round(time.Millisecond))
		for i := range 5 {
			if got := ask(tokA, "A", api); got != codes.OK {
				t.Errorf("A while B is down, request %d: %s", i, got)
			}
		}
		if err := b.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		until("B's Secret-bound token once B's API server is back", codes.OK, 30*time.Second, func() codes.Code { return ask(secretTokB, "B", "") })
	})
}

// hostileRemoteSecret creates a remote Secret whose kubeconfigs would have
// the CA run a command (evil-exec: an exec plugin writing a marker file)
// and send a token file (evil-file: a marker token, to a loopback HTTPS
// listener that records every request), waits until the CA has refused
// both, and checks that nothing ran, nothing was sent and both cluster
// ids are refused.
func hostileRemoteSecret(ctx context.Context, t *testing.T, secrets typedcorev1.SecretInterface, ns string,
	ask func(cluster string) codes.Code, metrics func() string) {
	t.Helper()
	dir := t.TempDir() // named for the subtest: quoted below
	marker, script, tokenFile := filepath.Join(dir, "exec-ran"), filepath.Join(dir, "plugin.sh"), filepath.Join(dir, "token")
	plugin := "#!/bin/sh\ntouch " + marker + "\n" +
		`echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"from-plugin"}}'` + "\n"
	if err := os.WriteFile(script, []byte(plugin), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte("marker-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" auth="+r.Header.Get("Authorization"))
		mu.Unlock()
		http.NotFound(w, r)
	}))
	defer srv.Close()
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	kubeconfig := func(user string) []byte {
		return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %s, certificate-authority-data: %s}}]
users: [{name: u, user: %s}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, srv.URL, ca, user)
	}
	hostile := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-remote-secret-hostile", Namespace: ns, Labels: map[string]string{"istio/multiCluster": "true"}},
		Data: map[string][]byte{
			"evil-exec": kubeconfig(`{exec: {apiVersion: client.authentication.k8s.io/v1, command: ` + strconv.Quote(script) + `, interactiveMode: Never}}`),
			"evil-file": kubeconfig(`{tokenFile: ` + strconv.Quote(tokenFile) + `}`),
		},
	}
	if _, err := secrets.Create(ctx, hostile, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := secrets.Delete(context.WithoutCancel(ctx), hostile.Name, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	}()
	refusedBoth := func(m string) bool {
		return strings.Contains(m, `workload_ca_remote_cluster_kubeconfigs_refused_total{reason="exec"} 1`) &&
			strings.Contains(m, `workload_ca_remote_cluster_kubeconfigs_refused_total{reason="file"} 1`)
	}
	began := time.Now()
	for m := metrics(); !refusedBoth(m); m = metrics() {
		if time.Since(began) > 20*time.Second {
			// Go on: what the CA did with them says more.
			t.Errorf("the CA did not count both hostile kubeconfigs refused within 20s:\n%s", grepLines(m, "refused", 20))
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !t.Failed() {
		t.Logf("both hostile kubeconfigs refused %v after the Secret was created", time.Since(began).Round(time.Millisecond))
	}
	for _, id := range []string{"evil-exec", "evil-file"} {
		if got := ask(id); got != codes.Unauthenticated {
			t.Errorf("a caller of cluster %s: %s, want Unauthenticated", id, got)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the CA ran the Secret's exec plugin")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 0 {
		t.Errorf("the CA reached the hostile server: %q", seen)
	}
}

// remoteKubeconfigOf is a kubeconfig for cluster cp as service account
// ns/sa, with the CA certificate inline, as a remote Secret holds it.
func remoteKubeconfigOf(t *testing.T, cp *controlplane.ControlPlane, ns, sa string) []byte {
	t.Helper()
	seconds := int64(3600)
	tr, err := cp.Client().CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(cp.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: remote
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: remote
  context: {cluster: remote, user: %s}
current-context: remote
`, cp.Host(), base64.StdEncoding.EncodeToString(caPEM), sa, tr.Status.Token, sa)
}

// scrape returns the CA's /metrics.
func scrape(t *testing.T, ca *cahost.CA) string {
	t.Helper()
	resp, err := http.Get("http://" + ca.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
