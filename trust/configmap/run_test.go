package configmap

import (
	"context"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	testclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/internal/rbac"
	"github.com/workload-ca/workload-ca/internal/testaccess"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testlog"
	"github.com/workload-ca/workload-ca/internal/testobs"
	"github.com/workload-ca/workload-ca/internal/testwait"
	"github.com/workload-ca/workload-ca/trust"
)

// fakeCluster returns a fake clientset holding objs that answers access
// reviews with allow (the fake's default answer is "denied").
func fakeCluster(allow func(*authzv1.ResourceAttributes) bool, objs ...runtime.Object) *fake.Clientset {
	client := fake.NewClientset(objs...)
	return testaccess.Answer(client, allow)
}

var allowAll = testaccess.AllowAll

// rootsIn returns the roots published in ns, or "" if there is no
// ConfigMap carrying our labels.
func rootsIn(c kubernetes.Interface, ns string) string {
	cm, err := c.CoreV1().ConfigMaps(ns).Get(context.Background(), ConfigMapName, metav1.GetOptions{})
	if err != nil || !trust.HasLabels(cm.Labels, ownLabels(testTD)) {
		return ""
	}
	return cm.Data[DataKey]
}

// TestRun drives Run against the fake clientset: existing namespaces, a
// new one, repair after an edit and a deletion, a roots change with
// Trigger, and one picked up by the periodic resync alone.
func TestRun(t *testing.T) {
	roots := testca.RootCerts(t, 2)
	client := fakeCluster(allowAll, namespace("a", nil), namespace("b", nil))
	rs := &testca.Roots{}
	rs.Set(roots[0])
	rec := &testobs.Results{}
	fc := testclock.NewFakeClock(time.Now())
	p, err := New(Config{Client: client, Options: trust.Options{TrustDomain: testTD, Roots: rs.Get, Observer: rec, Clock: fc, Logger: testlog.New(t)}})
	if err != nil {
		t.Fatal(err)
	}
	p.Trigger() // before Run: a no-op
	startRun(t, p)

	first := mustContent(t, roots[0])
	testwait.Eventually(t, "ConfigMaps in existing namespaces", func() bool {
		return rootsIn(client, "a") == first && rootsIn(client, "b") == first
	})

	if _, err := client.CoreV1().Namespaces().Create(context.Background(), namespace("c", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "ConfigMap in a new namespace", func() bool { return rootsIn(client, "c") == first })

	edited := configMap("a", map[string]string{DataKey: "tampered"}, ownLabels(testTD))
	if _, err := client.CoreV1().ConfigMaps("a").Update(context.Background(), edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "edited ConfigMap restored", func() bool { return rootsIn(client, "a") == first })

	if err := client.CoreV1().ConfigMaps("b").Delete(context.Background(), ConfigMapName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "deleted ConfigMap re-created", func() bool { return rootsIn(client, "b") == first })

	rs.Set(roots[0], roots[1])
	p.Trigger()
	both := mustContent(t, roots...)
	testwait.Eventually(t, "new roots after Trigger", func() bool {
		return rootsIn(client, "a") == both && rootsIn(client, "b") == both && rootsIn(client, "c") == both
	})

	rs.Set(roots[1])
	last := mustContent(t, roots[1])
	testwait.Eventually(t, "resync to publish new roots without a trigger", func() bool {
		fc.Step(trust.DefaultResyncPeriod)
		return rootsIn(client, "a") == last && rootsIn(client, "b") == last && rootsIn(client, "c") == last
	})
	if n := rec.Count(trust.ResultError); n != 0 {
		t.Errorf("%d reconciles failed", n)
	}
}

// TestRunNamespaceSelector: only matching namespaces get the ConfigMap,
// including one relabelled to match after Run started.
func TestRunNamespaceSelector(t *testing.T) {
	roots := testca.RootCerts(t, 1)
	client := fakeCluster(allowAll, namespace("on", map[string]string{"mesh": "on"}), namespace("off", nil))
	rec := &testobs.Results{}
	p, err := New(Config{Client: client, NamespaceSelector: labels.SelectorFromSet(labels.Set{"mesh": "on"}), Options: trust.Options{TrustDomain: testTD, Roots: func() []*x509.Certificate { return roots }, Observer: rec, Logger: testlog.New(t)}})
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, p)
	testwait.Eventually(t, "ConfigMap in the selected namespace, other one skipped", func() bool {
		return rootsIn(client, "on") != "" && rec.Count(trust.ResultSkipped) > 0
	})
	if rootsIn(client, "off") != "" {
		t.Fatal("ConfigMap published in a namespace not selected")
	}
	if _, err := client.CoreV1().Namespaces().Update(context.Background(),
		namespace("off", map[string]string{"mesh": "on"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "ConfigMap once the namespace is selected", func() bool { return rootsIn(client, "off") != "" })
}

func TestRunFailsFast(t *testing.T) {
	tests := []struct {
		name     string
		allow    func(*authzv1.ResourceAttributes) bool
		contains []string
		excludes string
	}{
		{name: "nothing allowed", allow: func(*authzv1.ResourceAttributes) bool { return false },
			contains: []string{`verb get on configmaps, resourceName "istio-ca-root-cert"`, "verb create on configmaps (group core);",
				"verb list on namespaces", "verb watch on namespaces"}},
		{name: "create restricted by name does not count",
			allow: func(ra *authzv1.ResourceAttributes) bool {
				return ra.Resource == "namespaces" || ra.Name == ConfigMapName
			},
			contains: []string{"verb create on configmaps"}, excludes: "resourceName"},
		{name: "one namespace only does not count",
			allow: func(ra *authzv1.ResourceAttributes) bool {
				return ra.Namespace != "" || ra.Resource == "namespaces"
			},
			contains: []string{`verb update on configmaps, resourceName "istio-ca-root-cert"`}, excludes: "on namespaces"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(Config{Client: fakeCluster(tc.allow), Options: trust.Options{TrustDomain: testTD, Roots: func() []*x509.Certificate { return nil }}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = p.Run(ctx)
			if !errors.Is(err, rbac.ErrPermissionDenied) {
				t.Fatalf("Run = %v, want ErrPermissionDenied", err)
			}
			for _, s := range tc.contains {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			if tc.excludes != "" && strings.Contains(err.Error(), tc.excludes) {
				t.Errorf("error %q contains %q", err, tc.excludes)
			}
		})
	}
}

// TestNamespaceOf checks the queue key of every kind of event.
func TestNamespaceOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		obj  any
		want string
	}{
		{"namespace", namespace("app", nil), "app"},
		{"ConfigMap", configMap("app", nil, nil), "app"},
		{"missed namespace deletion", cache.DeletedFinalStateUnknown{Key: "app"}, "app"},
		{"missed ConfigMap deletion", cache.DeletedFinalStateUnknown{Key: "app/" + ConfigMapName}, "app"},
		{"other ConfigMap", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "app"}}, "app"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, ok := namespaceOf(tc.obj); !ok || got != tc.want {
				t.Errorf("namespaceOf = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}
