package configmap

import (
	"crypto/x509"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/internal/contest"
	"github.com/workload-ca/workload-ca/internal/testwait"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

var testTD = spiffeid.RequireTrustDomainFromString("example.org")

// mustContent is rootset.PEM for roots that must be valid.
func mustContent(t testing.TB, roots ...*x509.Certificate) string {
	t.Helper()
	s, err := rootset.PEM(roots)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// configMap builds our ConfigMap in ns with data and labels.
func configMap(ns string, data, labels map[string]string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: ns, Labels: labels},
		Data:       data,
	}
	if labels[LabelManagedBy] == ManagedBy { // we wrote it
		cm.Annotations = contest.Stamp(nil, data[DataKey])
	}
	return cm
}

// namespace builds an active namespace with labels.
func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status:     corev1.NamespaceStatus{Phase: corev1.NamespaceActive},
	}
}

// startRun runs p in the background until stop is called or the test
// ends; Run must then return nil.
func startRun(t *testing.T, p *Publisher) (stop func()) {
	t.Helper()
	return testwait.Run(t, p.Run)
}
