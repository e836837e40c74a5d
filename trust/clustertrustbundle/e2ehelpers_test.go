package clustertrustbundle

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/internal/rbac"
	"github.com/workload-ca/workload-ca/internal/testwait"
	"github.com/workload-ca/workload-ca/trust"
)

// waitBundle waits until bundle name exists with signer, our labels and
// exactly roots (in any order), PEM without headers.
func waitBundle(t *testing.T, c kubernetes.Interface, name, signer string, roots ...*x509.Certificate) {
	t.Helper()
	var last string
	deadline := time.Now().Add(e2eTimeout)
	for {
		b, err := c.CertificatesV1().ClusterTrustBundles().Get(t.Context(), name, metav1.GetOptions{})
		if last = bundleMismatch(b, err, signer, roots); last == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("bundle %s after %v: %s", name, e2eTimeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// bundleMismatch says how b differs from what we publish, or "".
func bundleMismatch(b *certv1.ClusterTrustBundle, err error, signer string, roots []*x509.Certificate) string {
	if err != nil {
		return err.Error()
	}
	if b.Spec.SignerName != signer {
		return "signer " + b.Spec.SignerName
	}
	if !trust.HasLabels(b.Labels, liveLabels(testTD, testTD)) {
		return fmt.Sprintf("labels %v", b.Labels)
	}
	want := map[string]bool{}
	for _, r := range roots {
		want[string(r.Raw)] = true
	}
	rest := []byte(b.Spec.TrustBundle)
	for n := 0; ; n++ {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			if n != len(want) {
				return "wrong number of certificates"
			}
			return ""
		}
		if len(blk.Headers) != 0 || !want[string(blk.Bytes)] {
			return "unexpected certificate or PEM headers"
		}
	}
}

// grantPublisher binds a ClusterRole with the package's documented RBAC
// for signers (none: no attest) to a new user and returns a client acting
// as that user, once the apiserver applies the binding.
func grantPublisher(t *testing.T, cp *controlplane.ControlPlane, user string, signers ...string) kubernetes.Interface {
	t.Helper()
	rules := []rbacv1.PolicyRule{{
		APIGroups: []string{certificatesGroup},
		Resources: []string{"clustertrustbundles"},
		Verbs:     []string{"get", "list", "watch", "create", "update", "delete"},
	}}
	if len(signers) > 0 {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{certificatesGroup},
			Resources: []string{"signers"}, Verbs: []string{"attest"}, ResourceNames: signers})
	}
	client, err := cp.UserClient(t.Context(), user, rules)
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "RBAC for "+user, func() bool {
		return rbac.Check(t.Context(), client, rbac.Permission{Group: certificatesGroup, Resource: "clustertrustbundles", Verb: "delete"}) == nil
	})
	return client
}
