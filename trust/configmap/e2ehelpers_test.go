package configmap

import (
	"crypto/x509"
	"fmt"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/internal/rbac"
	"github.com/workload-ca/workload-ca/internal/testwait"
	"github.com/workload-ca/workload-ca/trust"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

// publisherNamespace holds the service accounts the e2e publishers run as.
const publisherNamespace = "workload-ca"

// documentedRules are the ClusterRole rules the package documentation
// names, exactly.
func documentedRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"},
			Verbs: []string{"get", "list", "watch", "update"}, ResourceNames: []string{ConfigMapName}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list", "watch"}},
	}
}

// waitRoots waits until ns holds our ConfigMap with our labels and exactly
// roots (in any order) under DataKey, and returns it.
func waitRoots(t *testing.T, c kubernetes.Interface, ns string, roots ...*x509.Certificate) *corev1.ConfigMap {
	t.Helper()
	var last string
	deadline := time.Now().Add(e2eTimeout)
	for {
		cm, err := c.CoreV1().ConfigMaps(ns).Get(t.Context(), ConfigMapName, metav1.GetOptions{})
		if last = rootsMismatch(cm, err, roots); last == "" {
			return cm
		}
		if time.Now().After(deadline) {
			t.Fatalf("ConfigMap %s/%s after %v: %s", ns, ConfigMapName, e2eTimeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rootsMismatch says how cm differs from what we publish, or "".
func rootsMismatch(cm *corev1.ConfigMap, err error, roots []*x509.Certificate) string {
	if err != nil {
		return err.Error()
	}
	if !trust.HasLabels(cm.Labels, ownLabels(testTD)) {
		return fmt.Sprintf("labels %v", cm.Labels)
	}
	got, err := rootset.PEM(roots)
	if err != nil {
		return err.Error()
	}
	if cm.Data[DataKey] != got {
		return DataKey + " holds other certificates" // never log certificates
	}
	return ""
}

// servicePublisher creates service account name in publisherNamespace,
// binds a ClusterRole with rules to it (none: no binding), and returns a
// client acting as it, once the apiserver applies the binding.
func servicePublisher(t *testing.T, cp *controlplane.ControlPlane, name string, rules []rbacv1.PolicyRule) kubernetes.Interface {
	t.Helper()
	if _, err := cp.CreateServiceAccount(t.Context(), publisherNamespace, name); err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cp.ServiceAccountConfig(publisherNamespace, name))
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) == 0 {
		return client
	}
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: publisherNamespace, Name: name}
	if err := cp.BindClusterRole(t.Context(), name, rules, subject); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "RBAC for "+name, func() bool { return rbac.Check(t.Context(), client, permissions()...) == nil })
	return client
}
