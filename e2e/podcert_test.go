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
	pcrs := f.s.cp.Client().CertificatesV1().PodCertificateRequests(f.ns)
	pcr, err := pcrs.Create(t.Context(), &certv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0-certs"},
		Spec: certv1.PodCertificateRequestSpec{SignerName: f.signer, PodName: "web-0", PodUID: "uid-web-0",
			ServiceAccountName: "web", ServiceAccountUID: "uid-web", NodeName: "node-a", NodeUID: "uid-node-a",
			MaxExpirationSeconds: ptr.To[int32](86400), StubPKCS10Request: stub},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = pollUntil(t, lcWait, func() (bool, error) {
		pcr, err = pcrs.Get(t.Context(), pcr.Name, metav1.GetOptions{})
		return err == nil && len(pcr.Status.Conditions) > 0, err
	})
	if err != nil {
		t.Fatalf("the request was not decided: %v", err)
	}
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
	// The CA audits the issue after its status update returns.
	if lines := waitLogLines(t, ca, "pod certificate issued", f.ns+"/web-0-certs"); len(lines) != 1 || strings.Contains(lines[0], "CERTIFICATE") {
		t.Errorf("audit records of the issue: %q; want one, without certificate or CSR", lines)
	}
}
