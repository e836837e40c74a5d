package e2e_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"go.step.sm/crypto/pemutil"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"

	"github.com/workload-ca/workload-ca/e2e/cahost"
)

// TestPodCertificates runs `workload-ca serve --pod-certificates` and asks
// for a certificate as the kubelet does for a pod with a podCertificate
// volume: the CA signs the X.509-SVID of the pod's service account for
// the kubelet's key, the chain verifies against the ClusterTrustBundles
// the CA publishes for the same signer, and the audit log records it.
func TestPodCertificates(t *testing.T) {
	f := newLCFixture(t, "podcert")
	ca := f.start(t, "--pod-certificates")
	theLeader(t, []*cahost.CA{ca})
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	stub, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	cp := f.s.cp
	web, err := cp.CreateServiceAccount(t.Context(), f.ns, "web")
	if err != nil {
		t.Fatal(err)
	}
	admin, err := cp.CreateServiceAccount(t.Context(), f.ns, "admin")
	if err != nil {
		t.Fatal(err)
	}
	pod, err := cp.CreatePod(t.Context(), f.ns, "web-0", "web", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	pcrs := cp.Client().CertificatesV1().PodCertificateRequests(f.ns)
	request := func(name string, sa *corev1.ServiceAccount) *certv1.PodCertificateRequest {
		t.Helper()
		pcr, err := pcrs.Create(t.Context(), &certv1.PodCertificateRequest{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: certv1.PodCertificateRequestSpec{SignerName: f.signer, PodName: pod.Name, PodUID: pod.UID,
				ServiceAccountName: sa.Name, ServiceAccountUID: sa.UID, NodeName: "node-a", NodeUID: "uid-node-a",
				MaxExpirationSeconds: ptr.To[int32](86400), StubPKCS10Request: stub},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		err = pollUntil(t, lcWait, func() (bool, error) {
			pcr, err = pcrs.Get(t.Context(), name, metav1.GetOptions{})
			return err == nil && len(pcr.Status.Conditions) > 0, err
		})
		if err != nil {
			t.Fatalf("request %s was not decided: %v", name, err)
		}
		return pcr
	}
	// Whoever may create requests may name any service account of the
	// namespace; the CA holds the request to what the pod runs as.
	if c := request("web-0-as-admin", admin).Status.Conditions[0]; c.Type != certv1.PodCertificateRequestConditionTypeDenied || c.Reason != "PodMismatch" {
		t.Errorf("a request naming a service account the pod does not run as: %s %s: %s; want Denied PodMismatch", c.Type, c.Reason, c.Message)
	}
	pcr := request("web-0-certs", web)
	if c := pcr.Status.Conditions[0]; c.Type != certv1.PodCertificateRequestConditionTypeIssued {
		t.Fatalf("condition %s %s: %s; want Issued", c.Type, c.Reason, c.Message)
	}
	chain, err := pemutil.ParseCertificateBundle([]byte(pcr.Status.CertificateChain))
	if err != nil {
		t.Fatal(err)
	}
	// The leader publishes the bundle and signs requests in tasks of their
	// own, so the bundle may land just after the certificate.
	var bundles *certv1.ClusterTrustBundleList
	err = pollUntil(t, lcWait, func() (bool, error) {
		bundles, err = f.s.cp.Client().CertificatesV1().ClusterTrustBundles().List(t.Context(),
			metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.signerName", f.signer).String()})
		return err == nil && len(bundles.Items) > 0, err
	})
	if err != nil {
		t.Fatalf("no ClusterTrustBundle of signer %s: %v", f.signer, err)
	}
	roots, err := pemutil.ParseCertificateBundle([]byte(bundles.Items[0].Spec.TrustBundle))
	if err != nil {
		t.Fatal(err)
	}
	want := spiffeid.RequireFromString(id(f.ns, "web"))
	got, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(want.TrustDomain(), roots))
	if err != nil || got != want {
		t.Fatalf("SVID %v, %v; want %v, verified by the published bundle", got, err, want)
	}
	if !chain[0].PublicKey.(*ecdsa.PublicKey).Equal(key.Public()) {
		t.Error("the leaf is not for the kubelet's key")
	}
	// One audit record, in the format of every door.
	if lines := waitLogLines(t, ca, `"msg":"certificate issued"`, `"door":"podcert"`, `"caller_kind":"kubelet"`, `"object":"`+f.ns+`/web-0-certs"`); len(lines) != 1 || strings.Contains(lines[0], "CERTIFICATE") {
		t.Errorf("audit records of the issue: %q; want one, without certificate or CSR", lines)
	}
}
