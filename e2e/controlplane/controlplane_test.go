package controlplane

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/e2e/internal/proc"
)

const extraPrefix = "authentication.kubernetes.io/"

// smokeFixture is a namespace, service account, node and pod.
type smokeFixture struct {
	c             *ControlPlane
	ns, sa, node  string
	pod           *corev1.Pod
	serviceAcct   *corev1.ServiceAccount
	istioCAToken  string
	nodeObjectUID string
}

func TestSmoke(t *testing.T) {
	c := StartForTest(t, Options{})
	tm := c.Timings()
	t.Logf("etcd healthy in %.2fs, kube-apiserver ready in %.2fs", tm.EtcdHealthy.Seconds(), tm.APIServerReady.Seconds())
	f := newSmokeFixture(t, c)

	t.Run("TokenReview of a pod-bound token", f.testTokenReview)
	t.Run("audit log counts TokenReviews only", f.testAudit)
	t.Run("other audience is rejected", f.testWrongAudience)
	t.Run("expired token is rejected", f.testExpired)
	t.Run("token expiry limits", f.testExpiryLimits)
	t.Run("node impersonation", f.testNodeIdentity)
	t.Run("kubeconfig", f.testKubeconfig)
	t.Run("Stop kills the servers", func(t *testing.T) {
		if err := c.Stop(); err != nil {
			t.Fatal(err)
		}
		for _, p := range []*proc.Process{c.etcd, c.apiserver} {
			if !p.Exited() {
				t.Errorf("%s (pid %d) not reaped after Stop", p.Name(), p.Pid())
			}
		}
	})
}

func newSmokeFixture(t *testing.T, c *ControlPlane) *smokeFixture {
	ctx := t.Context()
	f := &smokeFixture{c: c, ns: "smoke", sa: "ztunnel", node: "node-a"}
	if _, err := c.CreateNamespace(ctx, f.ns); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.serviceAcct, err = c.CreateServiceAccount(ctx, f.ns, f.sa); err != nil {
		t.Fatal(err)
	}
	node, err := c.CreateNode(ctx, f.node)
	if err != nil {
		t.Fatal(err)
	}
	f.nodeObjectUID = string(node.UID)
	if f.pod, err = c.CreatePod(ctx, f.ns, "app-0", f.sa, f.node); err != nil {
		t.Fatal(err)
	}
	if f.istioCAToken, err = c.PodToken(ctx, f.ns, f.sa, f.pod, "istio-ca", 600); err != nil {
		t.Fatal(err)
	}
	return f
}

// review runs a TokenReview with audience istio-ca as admin.
func (f *smokeFixture) review(t *testing.T, token string) authenticationv1.TokenReviewStatus {
	t.Helper()
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{
		Token: token, Audiences: []string{"istio-ca"},
	}}
	got, err := f.c.Client().AuthenticationV1().TokenReviews().Create(t.Context(), tr, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Status
}

func (f *smokeFixture) testTokenReview(t *testing.T) {
	st := f.review(t, f.istioCAToken)
	if !st.Authenticated {
		t.Fatalf("not authenticated: %q", st.Error)
	}
	if want := "system:serviceaccount:" + f.ns + ":" + f.sa; st.User.Username != want {
		t.Errorf("username %q, want %q", st.User.Username, want)
	}
	if st.User.UID != string(f.serviceAcct.UID) {
		t.Errorf("uid %q, want the service account's %q", st.User.UID, f.serviceAcct.UID)
	}
	if !slices.Equal(st.Audiences, []string{"istio-ca"}) {
		t.Errorf("audiences %v", st.Audiences)
	}
	want := map[string]string{
		"pod-name": f.pod.Name, "pod-uid": string(f.pod.UID),
		"node-name": f.node, "node-uid": f.nodeObjectUID,
	}
	for k, v := range want {
		if got := st.User.Extra[extraPrefix+k]; !slices.Equal(got, authenticationv1.ExtraValue{v}) {
			t.Errorf("extra %s = %v, want [%s]", k, got, v)
		}
	}
	if id := st.User.Extra[extraPrefix+"credential-id"]; len(id) != 1 || !strings.HasPrefix(id[0], "JTI=") {
		t.Errorf("credential-id = %v", id)
	}
}

func (f *smokeFixture) testAudit(t *testing.T) {
	before, err := f.c.CountAudit("create", "tokenreviews")
	if err != nil {
		t.Fatal(err)
	}
	f.review(t, f.istioCAToken)
	f.review(t, "not-a-token")
	if n, err := f.c.WaitAuditCount(t.Context(), "create", "tokenreviews", before+2); err != nil || n != before+2 {
		t.Fatalf("count = %d (%v), want %d", n, err, before+2)
	}
	events, err := f.c.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		if ev.ObjectRef == nil || ev.ObjectRef.Resource != "tokenreviews" {
			t.Errorf("unexpected audit event %s %s", ev.Verb, ev.RequestURI)
		}
	}
	if last := events[len(events)-1]; last.User.Username != "admin" {
		t.Errorf("last TokenReview by %q, want admin", last.User.Username)
	}
}

func (f *smokeFixture) testWrongAudience(t *testing.T) {
	tok, err := f.c.PodToken(t.Context(), f.ns, f.sa, f.pod, "https://kubernetes.default.svc", 600)
	if err != nil {
		t.Fatal(err)
	}
	if st := f.review(t, tok); st.Authenticated {
		t.Errorf("token for another audience authenticated for istio-ca")
	}
}

func (f *smokeFixture) testExpired(t *testing.T) {
	same, err := f.c.ResignToken(f.istioCAToken, func(map[string]any) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if st := f.review(t, same); !st.Authenticated {
		t.Fatalf("re-signed unchanged token rejected: %q", st.Error)
	}
	expired, err := f.c.ExpireToken(f.istioCAToken, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	st := f.review(t, expired)
	if st.Authenticated || !strings.Contains(st.Error, "expired") {
		t.Errorf("expired token: authenticated=%v error=%q", st.Authenticated, st.Error)
	}
}

func (f *smokeFixture) testExpiryLimits(t *testing.T) {
	ctx := t.Context()
	_, err := f.c.PodToken(ctx, f.ns, f.sa, f.pod, "istio-ca", 599)
	if err == nil || !strings.Contains(err.Error(), "less than 10 minutes") {
		t.Errorf("599s token: err = %v, want rejection", err)
	}
	// 3607s is the kubelet's magic value: extended to a year for API audiences.
	tok, err := f.c.PodToken(ctx, f.ns, f.sa, f.pod, "istio-ca", 3607)
	if err != nil {
		t.Fatal(err)
	}
	if life := tokenLifetime(t, tok); life < 300*24*time.Hour {
		t.Errorf("3607s istio-ca token lives %v, expected the one-year extension", life)
	}
}

func (f *smokeFixture) testNodeIdentity(t *testing.T) {
	cs, err := kubernetes.NewForConfig(f.c.NodeConfig(f.node))
	if err != nil {
		t.Fatal(err)
	}
	ssr, err := cs.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := ssr.Status.UserInfo
	if u.Username != "system:node:"+f.node || !slices.Contains(u.Groups, "system:nodes") {
		t.Errorf("acting as node: user %q groups %v", u.Username, u.Groups)
	}
	if _, err := cs.CoreV1().Pods(f.ns).Get(t.Context(), f.pod.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("node cannot read its own pod: %v", err)
	}
}

func (f *smokeFixture) testKubeconfig(t *testing.T) {
	b, err := os.ReadFile(f.c.KubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "server: "+f.c.Host()+"\n") {
		t.Errorf("kubeconfig lacks server %s:\n%s", f.c.Host(), b)
	}
	if _, err := os.Stat(f.c.CAFile()); err != nil {
		t.Error(err)
	}
}

// tokenLifetime returns exp - iat of a JWT, unverified.
func tokenLifetime(t *testing.T, token string) time.Duration {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct{ Iat, Exp int64 }
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	return time.Duration(claims.Exp-claims.Iat) * time.Second
}
