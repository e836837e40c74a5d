package podcert

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"go.step.sm/crypto/pemutil"
	certv1 "k8s.io/api/certificates/v1"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/internal/rbac"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testlog"
	"github.com/workload-ca/workload-ca/internal/testwait"
)

const testSigner = "workload-ca.io/spiffe"

var testTD = spiffeid.RequireTrustDomainFromString("cluster.local")

// grantSigner returns a client for user, bound to the rules the chart
// grants the CA for PodCertificateRequests, with the right to sign for
// signers (the chart's: one signer name), of which the first is the one
// the client will sign for.
func grantSigner(t *testing.T, cp *controlplane.ControlPlane, user string, signers ...string) kubernetes.Interface {
	t.Helper()
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"podcertificaterequests"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"podcertificaterequests/status"}, Verbs: []string{"update"}},
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"}, Verbs: []string{"sign"}, ResourceNames: signers},
	}
	client, err := cp.UserClient(t.Context(), user, rules)
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "RBAC for "+user, func() bool { return rbac.Check(t.Context(), client, permissions(signers[0])...) == nil })
	return client
}

// newPCR is a request as a kubelet makes it for a pod of sa in ns, with a
// stub CSR of key, for signer.
func newPCR(t testing.TB, ns, name, sa, signer string, key crypto.Signer, maxExpiration int32) *certv1.PodCertificateRequest {
	t.Helper()
	stub, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return &certv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: certv1.PodCertificateRequestSpec{
			SignerName: signer, PodName: name + "-pod", PodUID: types.UID("uid-pod-" + name),
			ServiceAccountName: sa, ServiceAccountUID: types.UID("uid-sa-" + sa),
			NodeName: "node-a", NodeUID: types.UID("uid-node-a"),
			MaxExpirationSeconds: ptr.To(maxExpiration), StubPKCS10Request: stub,
		},
	}
}

// TestE2E runs the signer as a user with the chart's rules against a real
// kube-apiserver, which validates every status it writes: a request is
// issued the pod's service account's SVID for its key, chaining to the
// root, within maxExpirationSeconds, with a refresh time the API server
// accepts; a P-521 key and user annotations are denied with the reasons
// Kubernetes defines or this signer documents; another signer's request
// is left alone. (The user may sign for that signer too, so only the
// controller's own choice keeps it away.)
func TestE2E(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.Client()
	if _, err := cp.CreateNamespace(t.Context(), "apps"); err != nil {
		t.Fatal(err)
	}
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P256)
	authority, err := ca.New(ca.Config{TrustDomain: testTD}, mid.Material())
	if err != nil {
		t.Fatal(err)
	}
	pcrs := admin.CertificatesV1().PodCertificateRequests("apps")
	create := func(pcr *certv1.PodCertificateRequest) {
		t.Helper()
		if _, err := pcrs.Create(t.Context(), pcr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// Before the signer starts: its first list would hand it this request
	// ahead of all the others, which one worker decides in order.
	create(newPCR(t, "apps", "other-signer", "web-sa", "example.com/other", key, 86400))

	var audit testlog.Buffer // written by the signer while the test reads it
	client := grantSigner(t, cp, "podcert-signer", testSigner, "example.com/other")
	c, err := New(Config{Client: client, SignerName: testSigner, TrustDomain: testTD,
		Signer: authority, Logger: testlog.New(t), Pipeline: newPipeline(t, authority, &audit, nil),
		Workers: 1}) // decides in order: see the other signer's request
	if err != nil {
		t.Fatal(err)
	}
	testwait.Run(t, c.Run)

	waitDecided := func(name string) *certv1.PodCertificateRequest {
		t.Helper()
		var got *certv1.PodCertificateRequest
		testwait.Eventually(t, "PodCertificateRequest "+name+" decided", func() bool {
			got, err = pcrs.Get(t.Context(), name, metav1.GetOptions{})
			return err == nil && decided(got)
		})
		return got
	}

	create(newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600))
	p521, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	create(newPCR(t, "apps", "big-key", "web-sa", testSigner, p521, 86400))
	annotated := newPCR(t, "apps", "annotated", "web-sa", testSigner, key, 86400)
	annotated.Spec.UnverifiedUserAnnotations = map[string]string{"example.com/dns-name": "web.apps.svc"}
	create(annotated)
	admin1 := newPCR(t, "apps", "claims-admin", "web-sa", testSigner, key, 86400)
	adminURI, _ := url.Parse("spiffe://cluster.local/ns/kube-system/sa/admin")
	if admin1.Spec.StubPKCS10Request, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{adminURI}}, key); err != nil {
		t.Fatal(err)
	}
	create(admin1)

	t.Run("issued", func(t *testing.T) {
		got := waitDecided("web")
		if cond := got.Status.Conditions[0]; cond.Type != certv1.PodCertificateRequestConditionTypeIssued {
			t.Fatalf("condition %+v, want Issued", cond)
		}
		chain, err := pemutil.ParseCertificateBundle([]byte(got.Status.CertificateChain))
		if err != nil || len(chain) != 2 {
			t.Fatalf("chain: %d certificates, %v; want leaf and intermediate", len(chain), err)
		}
		id, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(testTD, []*x509.Certificate{root.Cert}))
		if err != nil || id.String() != "spiffe://cluster.local/ns/apps/sa/web-sa" {
			t.Fatalf("SVID %v, %v; want spiffe://cluster.local/ns/apps/sa/web-sa verified by the root", id, err)
		}
		leaf := chain[0]
		if !leaf.PublicKey.(*ecdsa.PublicKey).Equal(key.Public()) {
			t.Error("leaf not issued to the requested key")
		}
		if v := leaf.NotAfter.Sub(leaf.NotBefore); v > time.Hour || v < time.Hour-time.Minute {
			t.Errorf("validity %v, want maxExpirationSeconds (1h)", v)
		}
		if !got.Status.NotAfter.Time.Equal(leaf.NotAfter) {
			t.Errorf("status.notAfter %v, leaf %v", got.Status.NotAfter, leaf.NotAfter)
		}
		// The record is written once the status update returns, which
		// can be after the test has read the status.
		testwait.Eventually(t, "the audit record of the issue", func() bool {
			return strings.Contains(audit.String(), `"msg":"certificate issued"`)
		})
	})
	t.Run("P-521 key denied as unsupported", func(t *testing.T) {
		got := waitDecided("big-key")
		if cond := got.Status.Conditions[0]; cond.Type != certv1.PodCertificateRequestConditionTypeDenied || cond.Reason != ReasonUnsupportedKeyType {
			t.Fatalf("condition %+v, want Denied %s", cond, ReasonUnsupportedKeyType)
		}
	})
	t.Run("user annotations denied", func(t *testing.T) {
		got := waitDecided("annotated")
		if cond := got.Status.Conditions[0]; cond.Type != certv1.PodCertificateRequestConditionTypeDenied || cond.Reason != ReasonInvalidUserAnnotations {
			t.Fatalf("condition %+v, want Denied %s", cond, ReasonInvalidUserAnnotations)
		}
	})
	t.Run("a stub CSR naming another identity denied", func(t *testing.T) {
		got := waitDecided("claims-admin")
		if cond := got.Status.Conditions[0]; cond.Type != certv1.PodCertificateRequestConditionTypeDenied || cond.Reason != ReasonInvalidRequest {
			t.Fatalf("condition %+v, want Denied %s", cond, ReasonInvalidRequest)
		}
	})
	t.Run("another signer's request left alone", func(t *testing.T) {
		// Every request above was decided after this one was listed.
		got, err := pcrs.Get(t.Context(), "other-signer", metav1.GetOptions{})
		if err != nil || decided(got) {
			t.Fatalf("other signer's request: %v, conditions %+v; want untouched", err, got.Status.Conditions)
		}
		if strings.Contains(audit.String(), "other-signer") {
			t.Errorf("an audit record names the other signer's request:\n%s", audit.String())
		}
	})
	t.Run("several workers decide many requests, each once", func(t *testing.T) {
		checkWorkers(t, cp, authority, key)
	})
}

// pairSigner is a Signer that holds its first call until a second one
// runs beside it (or a timeout passes), and remembers whether one did.
type pairSigner struct {
	Signer
	paired   chan struct{} // closed by the second call
	once     sync.Once
	calls    atomic.Int32
	overlaps atomic.Bool
}

func (p *pairSigner) Sign(ctx context.Context, r ca.Request) (*ca.Issued, error) {
	switch p.calls.Add(1) {
	case 1:
		select {
		case <-p.paired:
			p.overlaps.Store(true)
		case <-time.After(5 * time.Second): // less than the test waits for the decisions
		}
	case 2:
		p.once.Do(func() { close(p.paired) })
	}
	return p.Signer.Sign(ctx, r)
}

// checkWorkers runs a controller with four workers, for a signer name of
// its own, over requests created at once: two are signed at the same time,
// and every request gets exactly one decision, written once and audited
// once.
func checkWorkers(t *testing.T, cp *controlplane.ControlPlane, authority *ca.Authority, key crypto.Signer) {
	const signer, n = "workload-ca.io/spiffe-workers", 24
	if _, err := cp.CreateNamespace(t.Context(), "many"); err != nil {
		t.Fatal(err)
	}
	pcrs := cp.Client().CertificatesV1().PodCertificateRequests("many")
	for i := range n {
		if _, err := pcrs.Create(t.Context(), newPCR(t, "many", fmt.Sprintf("pod-%02d", i), "web-sa", signer, key, 3600), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var audit testlog.Buffer
	signing := &pairSigner{Signer: authority, paired: make(chan struct{})}
	c, err := New(Config{Client: grantSigner(t, cp, "podcert-workers", signer), SignerName: signer, TrustDomain: testTD,
		Signer: signing, Logger: testlog.New(t), Pipeline: newPipeline(t, signing, &audit, nil), Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	testwait.Run(t, c.Run)
	// The pipeline audits a certificate before its status is written:
	// wait for both.
	var list *certv1.PodCertificateRequestList
	testwait.Eventually(t, "every request audited and decided", func() bool {
		if strings.Count(audit.String(), `"msg":"certificate issued"`) < n {
			return false
		}
		var err error
		if list, err = pcrs.List(t.Context(), metav1.ListOptions{}); err != nil {
			return false
		}
		for _, pcr := range list.Items {
			if len(pcr.Status.Conditions) == 0 {
				return false
			}
		}
		return true
	})
	if !signing.overlaps.Load() {
		t.Error("no two requests were signed at once")
	}
	for _, pcr := range list.Items {
		if conds := pcr.Status.Conditions; len(conds) != 1 || conds[0].Type != certv1.PodCertificateRequestConditionTypeIssued {
			t.Errorf("%s: conditions %+v, want one Issued", pcr.Name, conds)
		}
	}
	if got := strings.Count(audit.String(), `"msg":"certificate issued"`); got != n || signing.calls.Load() != n {
		t.Errorf("%d issue records and %d signatures for %d requests, want one each", got, signing.calls.Load(), n)
	}
}

// TestE2EV1beta1 signs requests in certificates.k8s.io/v1beta1, the only
// version Kubernetes 1.35 and 1.36 serve, against a real kube-apiserver
// serving it (1.37 with v1beta1 enabled beside v1, which its own
// controllers need): a request with a stub CSR and one in the deprecated
// form of a 1.35 kubelet (a PKIX public key and a proof of possession)
// are both issued, and read back in v1beta1.
func TestE2EV1beta1(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{ExtraAPIServerFlags: map[string]string{
		"runtime-config": "certificates.k8s.io/v1beta1/podcertificaterequests=true",
	}})
	if _, err := cp.CreateNamespace(t.Context(), "apps"); err != nil {
		t.Fatal(err)
	}
	root := testca.NewRoot(t, testca.P256)
	authority, err := ca.New(ca.Config{TrustDomain: testTD}, root.Material())
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pcrs := cp.Client().CertificatesV1beta1().PodCertificateRequests("apps")
	stubbed := toV1beta1(&item{PodCertificateRequest: newPCR(t, "apps", "stub", "web-sa", testSigner, key, 3600)})
	legacy := toV1beta1(&item{PodCertificateRequest: newPCR(t, "apps", "legacy", "web-sa", testSigner, key, 3600)})
	legacy.Spec.StubPKCS10Request = nil
	if legacy.Spec.PKIXPublicKey, err = x509.MarshalPKIXPublicKey(key.Public()); err != nil { //nolint:staticcheck // the 1.35 kubelet's form under test
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(legacy.Spec.PodUID))
	if legacy.Spec.ProofOfPossession, err = ecdsa.SignASN1(rand.Reader, key, sum[:]); err != nil { //nolint:staticcheck // the 1.35 kubelet's form under test
		t.Fatal(err)
	}
	for _, p := range []*certv1beta1.PodCertificateRequest{stubbed, legacy} {
		p.TypeMeta = metav1.TypeMeta{}
		if _, err := pcrs.Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s in v1beta1: %v", p.Name, err)
		}
	}

	client := grantSigner(t, cp, "podcert-signer-v1beta1", testSigner)
	c, err := New(Config{Client: client, SignerName: testSigner, TrustDomain: testTD, Signer: authority,
		Pipeline: newPipeline(t, authority, io.Discard, nil), Logger: testlog.New(t), APIVersion: APIv1beta1})
	if err != nil {
		t.Fatal(err)
	}
	testwait.Run(t, c.Run)
	for _, name := range []string{"stub", "legacy"} {
		t.Run(name, func(t *testing.T) {
			var got *certv1beta1.PodCertificateRequest
			testwait.Eventually(t, "v1beta1 request "+name+" decided", func() bool {
				got, err = pcrs.Get(t.Context(), name, metav1.GetOptions{})
				return err == nil && len(got.Status.Conditions) > 0
			})
			if cond := got.Status.Conditions[0]; cond.Type != certv1beta1.PodCertificateRequestConditionTypeIssued {
				t.Fatalf("condition %+v, want Issued", cond)
			}
			chain, err := pemutil.ParseCertificateBundle([]byte(got.Status.CertificateChain))
			if err != nil || len(chain) == 0 {
				t.Fatalf("chain: %v", err)
			}
			id, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(testTD, []*x509.Certificate{root.Cert}))
			if err != nil || id.String() != "spiffe://cluster.local/ns/apps/sa/web-sa" || !chain[0].PublicKey.(*ecdsa.PublicKey).Equal(key.Public()) {
				t.Fatalf("SVID %v, %v; want spiffe://cluster.local/ns/apps/sa/web-sa for the request's key, verified by the root", id, err)
			}
		})
	}
}
