package clustertrustbundle

import (
	"crypto/x509"
	"maps"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/internal/contest"
	"github.com/workload-ca/workload-ca/internal/testwait"
)

var testTD = spiffeid.RequireTrustDomainFromString("example.org")

// mustContent is bundleContent for roots that must be valid.
func mustContent(t testing.TB, roots ...*x509.Certificate) string {
	t.Helper()
	s, err := bundleContent(roots)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// hashedName is the name of our default signer's bundle for content.
func hashedName(content string) string {
	return target{signer: DefaultSignerName}.name(content)
}

// bundle builds a ClusterTrustBundle.
func bundle(name, signer, content string, labels map[string]string) *certv1.ClusterTrustBundle {
	b := &certv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       certv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: content},
	}
	if labels[LabelManagedBy] == ManagedBy { // we wrote it
		b.Annotations = contest.Stamp(nil, content)
	}
	return b
}

// startRun runs p in the background until the test ends; Run must then
// return nil.
func startRun(t *testing.T, p *Publisher) {
	t.Helper()
	testwait.Run(t, p.Run)
}

// merged is a copy of a with the labels of b added.
func merged(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	maps.Copy(out, b)
	return out
}

// liveLabels are the labels of a live bundle of a CA of trust domain
// workload holding peer's roots.
func liveLabels(workload, peer spiffeid.TrustDomain) map[string]string {
	return withStage(ownLabels(workload, peer), "")
}
