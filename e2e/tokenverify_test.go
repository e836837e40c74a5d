package e2e_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
)

// verifyFixture is a control plane of its own (the test restarts its API
// server) and two CAs: one verifying tokens locally, with the keys fetched
// every keysRefresh, and one sending every new token to a TokenReview.
type verifyFixture struct {
	cp  *controlplane.ControlPlane
	cas []verifyingCA
}

type verifyingCA struct {
	mode   string // --token-verification
	ca     *cahost.CA
	client *caclient.Client
}

const keysRefresh = 2 * time.Second

// TestTokenVerificationMatchesTokenReview: with --token-verification=local
// the CA answers every token as a TokenReview does, in each case this
// suite can build, and so does a CA with --token-verification=tokenreview;
// pod-bound tokens of live pods cost the first no TokenReview, and the
// second one for many requests. After a change, the TokenReview's answer
// is read first and each CA must give the same within the bound named.
func TestTokenVerificationMatchesTokenReview(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	f := newVerifyFixture(t)
	ctx := t.Context()
	ns := "verify"
	for _, sa := range []string{"web", "again", "bound"} {
		f.mustSA(t, ns, sa)
	}
	node := f.mustNode(t, "node-v")
	pod := f.mustPod(t, ns, "web-0", "web", node.Name)

	t.Run("a live pod's token: 20 requests, no TokenReview verifying locally, one without", func(t *testing.T) {
		tok := f.podToken(t, pod, audience)
		for _, c := range f.cas {
			want := map[string]int{"local": 0, "tokenreview": 1}[c.mode]
			if n := f.caReviews(t, c, tok); n != want {
				t.Errorf("%s: the CA made %d TokenReviews for 20 requests, want %d", c.mode, n, want)
			}
		}
		f.wantSame(t, tok, true, 0)
	})
	t.Run("after its pod is deleted", func(t *testing.T) {
		p := f.mustPod(t, ns, "web-1", "web", node.Name)
		tok := f.podToken(t, p, audience)
		f.wantSame(t, tok, true, 0)
		f.deletePod(t, p)
		f.wantSame(t, tok, false, 15*time.Second)
	})
	t.Run("a pod deleted and created again under its name", func(t *testing.T) {
		p := f.mustPod(t, ns, "web-2", "web", node.Name)
		old := f.podToken(t, p, audience)
		f.wantSame(t, old, true, 0)
		f.deletePod(t, p)
		p = f.mustPod(t, ns, "web-2", "web", node.Name)
		f.wantSame(t, old, false, 15*time.Second)
		f.wantSame(t, f.podToken(t, p, audience), true, 0)
	})
	t.Run("a service account deleted and created again", func(t *testing.T) {
		p := f.mustPod(t, ns, "again-0", "again", node.Name)
		tok := f.podToken(t, p, audience)
		f.wantSame(t, tok, true, 0)
		if err := f.cp.Client().CoreV1().ServiceAccounts(ns).Delete(ctx, "again", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		f.mustSA(t, ns, "again")
		f.wantSame(t, tok, false, 15*time.Second)
	})
	t.Run("expired beyond the minute of leeway", func(t *testing.T) {
		tok, err := f.cp.ExpireToken(f.podToken(t, pod, audience), 5*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		f.wantSame(t, tok, false, 0)
	})
	t.Run("of a foreign issuer", func(t *testing.T) {
		tok, err := f.cp.ResignToken(f.podToken(t, pod, audience), func(c map[string]any) error {
			c["iss"] = "https://oidc.example.com"
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		f.wantSame(t, tok, false, 0)
	})
	t.Run("for another audience", func(t *testing.T) {
		f.wantSame(t, f.podToken(t, pod, "vault"), false, 0)
	})
	t.Run("bound to a Secret, and after it is deleted", func(t *testing.T) {
		secret, err := f.cp.Client().CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bound"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tok := f.boundToken(t, ns, "bound", "Secret", secret.Name, string(secret.UID))
		f.wantSame(t, tok, true, 0)
		if err := f.cp.Client().CoreV1().Secrets(ns).Delete(ctx, secret.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		f.wantSame(t, tok, false, 30*time.Second)
	})
	t.Run("bound to a Node, and after it is deleted", func(t *testing.T) {
		n := f.mustNode(t, "node-bound")
		tok := f.boundToken(t, ns, "bound", "Node", n.Name, string(n.UID))
		f.wantSame(t, tok, true, 0)
		if err := f.cp.Client().CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		f.wantSame(t, tok, false, 30*time.Second)
	})
	t.Run("signed with a key the API server revoked", func(t *testing.T) {
		old := f.podToken(t, pod, audience)
		f.wantSame(t, old, true, 0)
		if err := f.cp.RotateServiceAccountKey(); err != nil {
			t.Fatal(err)
		}
		if err := f.cp.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		if err := f.cp.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		f.wantSame(t, old, false, keysRefresh+15*time.Second)
		f.wantSame(t, f.podToken(t, pod, audience), true, 0)
	})
}

func newVerifyFixture(t *testing.T) *verifyFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cp := ownControlPlane(ctx, t, dir, "istio-system", "verify")
	f := &verifyFixture{cp: cp}
	for _, mode := range []string{"local", "tokenreview"} {
		ca, err := cahost.Start(ctx, cahost.Options{Kubeconfig: cp.KubeconfigPath(), WorkDir: filepath.Join(dir, "ca-"+mode),
			ExtraArgs: []string{"--token-verification", mode, "--token-keys-refresh", keysRefresh.String(),
				"--leader-election-id", "workload-ca-" + mode}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := ca.Stop(); err != nil {
				t.Error(err)
			}
		})
		f.cas = append(f.cas, verifyingCA{mode: mode, ca: ca, client: dialCA(t, ca)})
	}
	return f
}

func (f *verifyFixture) mustSA(t *testing.T, ns, name string) {
	t.Helper()
	if _, err := f.cp.CreateServiceAccount(t.Context(), ns, name); err != nil {
		t.Fatal(err)
	}
}

func (f *verifyFixture) mustNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := f.cp.CreateNode(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *verifyFixture) mustPod(t *testing.T, ns, name, sa, node string) *corev1.Pod {
	t.Helper()
	p, err := f.cp.CreatePod(t.Context(), ns, name, sa, node)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *verifyFixture) deletePod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	zero := int64(0)
	if err := f.cp.Client().CoreV1().Pods(p.Namespace).Delete(t.Context(), p.Name,
		metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
}

func (f *verifyFixture) podToken(t *testing.T, p *corev1.Pod, aud string) string {
	t.Helper()
	tok, err := f.cp.PodToken(t.Context(), p.Namespace, p.Spec.ServiceAccountName, p, aud, 3600)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// boundToken mints a token of ns/sa bound to an object of kind.
func (f *verifyFixture) boundToken(t *testing.T, ns, sa, kind, name, uid string) string {
	t.Helper()
	tok, err := f.cp.BoundToken(t.Context(), ns, sa, kind, name, types.UID(uid), audience, 3600)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// reviewSays is the API server's answer.
func (f *verifyFixture) reviewSays(t *testing.T, token string) bool {
	t.Helper()
	tr, err := f.cp.Client().AuthenticationV1().TokenReviews().Create(t.Context(), &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{audience}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Authenticated
}

// caSays is c's answer to the token's caller asking for its own identity:
// accepted, or refused as unauthenticated.
func (f *verifyFixture) caSays(t *testing.T, c verifyingCA, token string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	own, err := ownIdentity(token)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.client.CreateCertificate(ctx, caclient.Request{Token: token, Identity: own})
	switch status.Code(err) {
	case codes.OK:
		return true
	case codes.Unauthenticated:
		return false
	}
	t.Errorf("%s: the CA answered %v", c.mode, err)
	return false
}

// wantSame waits until the API server's TokenReview gives want, then
// until each CA does too, within bound.
func (f *verifyFixture) wantSame(t *testing.T, token string, want bool, bound time.Duration) {
	t.Helper()
	if err := pollUntil(t, 20*time.Second, func() (bool, error) { return f.reviewSays(t, token) == want, nil }); err != nil {
		t.Fatalf("the TokenReview never said %v: %v", want, err)
	}
	began := time.Now()
	for _, c := range f.cas {
		if err := pollUntil(t, bound, func() (bool, error) { return f.caSays(t, c, token) == want, nil }); err != nil {
			t.Fatalf("the TokenReview says %v; the CA with --token-verification=%s did not within %v", want, c.mode, bound)
		}
		if bound > 0 {
			t.Logf("--token-verification=%s: the CA said %v %v after the TokenReview did", c.mode, want,
				time.Since(began).Round(10*time.Millisecond))
		}
	}
}

// markerUser makes the TokenReview that marks the end of a count.
const markerUser = "tokenreview-count-marker"

// caReviews is how many TokenReviews c makes for 20 requests (8 at once,
// then 12 one by one) with a token it has not seen.
func (f *verifyFixture) caReviews(t *testing.T, c verifyingCA, token string) int {
	t.Helper()
	before, markers, err := f.tokenReviews()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { f.caSays(t, c, token) })
	}
	wg.Wait()
	for range 12 {
		f.caSays(t, c, token)
	}
	// The API server writes a request's audit event just after answering
	// it. A TokenReview of the test's own (impersonating markerUser),
	// made after the CA's were answered, marks the end: once its event is
	// in the log, so are theirs.
	marker, err := kubernetes.NewForConfig(f.cp.ImpersonatedConfig(markerUser, "system:masters"))
	if err != nil {
		t.Fatal(err)
	}
	review := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: "marker"}}
	if _, err := marker.AuthenticationV1().TokenReviews().Create(t.Context(), review, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var after int
	if err := pollUntil(t, 5*time.Second, func() (bool, error) {
		n, m, err := f.tokenReviews()
		after = n
		return m > markers, err
	}); err != nil {
		t.Fatalf("the marker TokenReview is not in the audit log: %v", err)
	}
	return after - before
}

// tokenReviews counts the TokenReviews in the audit log: the markers of
// caReviews, and the others.
func (f *verifyFixture) tokenReviews() (others, markers int, err error) {
	events, err := f.cp.AuditEvents()
	for _, ev := range events {
		switch {
		case ev.Stage != "ResponseComplete" || ev.ObjectRef == nil || ev.ObjectRef.Resource != "tokenreviews" || ev.Verb != "create":
		case ev.ImpersonatedUser != nil && ev.ImpersonatedUser.Username == markerUser:
			markers++
		default:
			others++
		}
	}
	return others, markers, err
}

// ownIdentity is the SPIFFE ID of the service account a token names (read
// from its claims, unverified).
func ownIdentity(token string) (spiffeid.ID, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return spiffeid.ID{}, fmt.Errorf("not a compact JWS")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return spiffeid.ID{}, err
	}
	var claims struct {
		Kubernetes struct {
			Namespace      string `json:"namespace"`
			ServiceAccount struct {
				Name string `json:"name"`
			} `json:"serviceaccount"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return spiffeid.ID{}, err
	}
	return spiffeid.FromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"),
		"ns", claims.Kubernetes.Namespace, "sa", claims.Kubernetes.ServiceAccount.Name)
}
