package configmap

import (
	"crypto/x509"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/internal/rbac"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testlog"
	"github.com/workload-ca/workload-ca/internal/testobs"
	"github.com/workload-ca/workload-ca/internal/testwait"
	"github.com/workload-ca/workload-ca/trust"
)

// e2eTimeout bounds every wait for the publisher to converge.
const e2eTimeout = 10 * time.Second

// TestE2E runs publishers against a real kube-apiserver, as service
// accounts holding exactly the RBAC the package documents. The steps share
// one control plane and run in order.
func TestE2E(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.Client()
	for _, ns := range []string{publisherNamespace, "alpha", "beta"} {
		if _, err := cp.CreateNamespace(t.Context(), ns); err != nil {
			t.Fatal(err)
		}
	}
	roots := testca.RootCerts(t, 3)
	rs := &testca.Roots{}
	rs.Set(roots[0])
	rec := &testobs.Results{}
	user := servicePublisher(t, cp, "rootconfigmap-publisher", documentedRules())
	var logs testlog.Buffer
	log := slog.New(slog.NewMultiHandler(testlog.New(t).Handler(), slog.NewTextHandler(&logs, nil)))
	p, err := New(Config{Client: user, Options: trust.Options{TrustDomain: testTD, Roots: rs.Get, Observer: rec, Logger: log, RepairInterval: contestInterval}})
	if err != nil {
		t.Fatal(err)
	}
	stop := startRun(t, p)

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"every existing namespace gets the roots", func(t *testing.T) {
			for _, ns := range namespaceNames(t, admin) {
				waitRoots(t, admin, ns, roots[0])
			}
		}},
		{"a namespace created later gets the roots", func(t *testing.T) {
			if _, err := cp.CreateNamespace(t.Context(), "gamma"); err != nil {
				t.Fatal(err)
			}
			waitRoots(t, admin, "gamma", roots[0])
		}},
		{"a deleted ConfigMap comes back", func(t *testing.T) {
			if err := admin.CoreV1().ConfigMaps("alpha").Delete(t.Context(), ConfigMapName, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			waitRoots(t, admin, "alpha", roots[0])
		}},
		{"an edited root-cert.pem is restored, other keys kept", func(t *testing.T) {
			testRepairEdit(t, admin, roots, rec)
		}},
		{"a rival publisher is named, and repaired at most once per interval", func(t *testing.T) {
			testRival(t, admin, roots, rec, &logs)
		}},
		{"new roots after Trigger", func(t *testing.T) {
			rs.Set(roots[1], roots[0])
			p.Trigger()
			for _, ns := range namespaceNames(t, admin) {
				waitRoots(t, admin, ns, roots[0], roots[1])
			}
		}},
		{"a namespace being deleted is left alone", func(t *testing.T) {
			testTerminating(t, admin, rec)
		}},
		{"no failed reconciles", func(t *testing.T) {
			if n := rec.Count(trust.ResultError); n != 0 {
				t.Errorf("%d reconciles failed", n)
			}
			stop()
		}},
		{"a new leader tells a rival's edit from its predecessor's write", func(t *testing.T) {
			testNewLeader(t, user, admin, rs.Get, roots[2], log)
		}},
		{"a namespace not selected gets none", func(t *testing.T) {
			testSelector(t, cp, user, roots[2])
		}},
		{"without the RBAC rules Run fails", func(t *testing.T) { testNoRBAC(t, cp) }},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			t.FailNow() // later steps build on earlier ones
		}
	}
}

// namespaceNames lists every namespace that is not being deleted.
func namespaceNames(t *testing.T, c kubernetes.Interface) []string {
	t.Helper()
	list, err := c.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ns := range list.Items {
		if ns.DeletionTimestamp == nil {
			out = append(out, ns.Name)
		}
	}
	if len(out) < 4 {
		t.Fatalf("namespaces %v: want at least the system ones and ours", out)
	}
	return out
}

// testRepairEdit replaces beta's roots, drops a label and adds a key: the
// roots and label come back, the key stays.
func testRepairEdit(t *testing.T, admin kubernetes.Interface, roots []*x509.Certificate, rec *testobs.Results) {
	cms := admin.CoreV1().ConfigMaps("beta")
	cm, err := cms.Get(t.Context(), ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[DataKey] = mustContent(t, roots[2])
	cm.Data["extra"] = "kept"
	delete(cm.Labels, LabelManagedBy)
	if _, err := cms.Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := waitRoots(t, admin, "beta", roots[0]); got.Data["extra"] != "kept" {
		t.Errorf("data %v: key extra lost", got.Data)
	}
	// The repair is counted once its update returns, which can be after
	// the test has seen it.
	testwait.Eventually(t, "the repair counted", func() bool { return rec.Count(trust.ResultRepaired) == 1 })
}

// contestInterval is the publisher's RepairInterval in TestE2E.
const contestInterval = 3 * time.Second

// testRival plays istiod's namespace controller, which writes its own root
// into the ConfigMap: the first write is undone at once and the rival's
// field manager logged; the second, right after, stands until the repair
// interval has passed since the first repair.
func testRival(t *testing.T, admin kubernetes.Interface, roots []*x509.Certificate, rec *testobs.Results, logs *testlog.Buffer) {
	cms := admin.CoreV1().ConfigMaps("alpha")
	rival := func() {
		t.Helper()
		cm, err := cms.Get(t.Context(), ConfigMapName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data[DataKey] = mustContent(t, roots[2])
		if _, err := cms.Update(t.Context(), cm, metav1.UpdateOptions{FieldManager: "pilot-discovery"}); err != nil {
			t.Fatal(err)
		}
	}
	repaired := rec.Count(trust.ResultRepaired)
	first := time.Now() // the first repair comes after this moment
	rival()
	waitRoots(t, admin, "alpha", roots[0])
	testwait.Eventually(t, "the repair counted", func() bool { return rec.Count(trust.ResultRepaired) >= repaired+1 })
	if rec.Count(trust.ResultRepaired) != repaired+1 {
		t.Fatalf("%d repairs counted, want 1", rec.Count(trust.ResultRepaired)-repaired)
	}
	if !strings.Contains(logs.String(), "another writer changed the roots") || !strings.Contains(logs.String(), "pilot-discovery") {
		t.Fatalf("the repair was not logged with the rival's field manager:\n%s", logs.String())
	}

	rival()
	waitRoots(t, admin, "alpha", roots[0])
	testwait.Eventually(t, "the second repair counted", func() bool { return rec.Count(trust.ResultRepaired) >= repaired+2 })
	if d := time.Since(first); d < contestInterval-time.Second {
		t.Errorf("the second change was undone %v after the first one was made, within the %v repair interval", d, contestInterval)
	}
	if rec.Count(trust.ResultDeferred) == 0 || rec.Count(trust.ResultRepaired) != repaired+2 {
		t.Errorf("deferred %d, repaired %d times; want the second repair deferred", rec.Count(trust.ResultDeferred), rec.Count(trust.ResultRepaired)-repaired)
	}
}

// testNewLeader has the rival write its root into alpha's ConfigMap while
// no publisher runs, then starts a new one, without its predecessor's
// history: the stamp on the ConfigMap tells it the roots there are not the
// ones last published, so it repairs them (and names the rival) instead
// of taking them for its predecessor's. Every other namespace, stamped
// with the current roots, is left unchanged.
func testNewLeader(t *testing.T, user, admin kubernetes.Interface, roots func() []*x509.Certificate, rivalRoot *x509.Certificate, log *slog.Logger) {
	cms := admin.CoreV1().ConfigMaps("alpha")
	cm, err := cms.Get(t.Context(), ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[DataKey] = mustContent(t, rivalRoot)
	if _, err := cms.Update(t.Context(), cm, metav1.UpdateOptions{FieldManager: "pilot-discovery"}); err != nil {
		t.Fatal(err)
	}
	rec := &testobs.Results{}
	p, err := New(Config{Client: user, Options: trust.Options{TrustDomain: testTD, Roots: roots, Observer: rec, Logger: log, RepairInterval: contestInterval}})
	if err != nil {
		t.Fatal(err)
	}
	stop := startRun(t, p)
	defer stop()
	waitRoots(t, admin, "alpha", roots()...)
	testwait.Eventually(t, "the repair counted", func() bool { return rec.Count(trust.ResultRepaired) >= 1 })
	if n := rec.Count(trust.ResultRepaired); n != 1 {
		t.Errorf("%d repairs counted, want 1 (the rival's edit)", n)
	}
	// Every live namespace but alpha ends Unchanged, and so does alpha
	// once the repair's own event comes back; gamma (terminating) is
	// skipped. A namespace wrongly updated would be counted Unchanged only
	// after its update, so the check below would see that.
	live := len(namespaceNames(t, admin))
	testwait.Eventually(t, "every namespace reconciled", func() bool {
		return rec.Count(trust.ResultUnchanged) >= live && rec.Count(trust.ResultSkipped) >= 1
	})
	if n := rec.Count(trust.ResultUpdated); n != 0 {
		t.Errorf("%d updates counted, want none: the other ConfigMaps hold the current roots", n)
	}
}

// testTerminating deletes namespace gamma, which stays Terminating (no
// namespace controller runs here), then its ConfigMap: the publisher sees
// the event, skips the namespace, and does not re-create it.
func testTerminating(t *testing.T, admin kubernetes.Interface, rec *testobs.Results) {
	skipped := rec.Count(trust.ResultSkipped)
	if err := admin.CoreV1().Namespaces().Delete(t.Context(), "gamma", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ns, err := admin.CoreV1().Namespaces().Get(t.Context(), "gamma", metav1.GetOptions{})
	if err != nil || ns.Status.Phase != corev1.NamespaceTerminating {
		t.Fatalf("namespace gamma = %v, %v; want it Terminating", ns, err)
	}
	// The namespace's change is skipped first; then the ConfigMap's
	// deletion must be skipped too, not undone.
	testwait.Eventually(t, "terminating gamma skipped", func() bool { return rec.Count(trust.ResultSkipped) > skipped })
	skipped = rec.Count(trust.ResultSkipped)
	if err := admin.CoreV1().ConfigMaps("gamma").Delete(t.Context(), ConfigMapName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "gamma skipped after its ConfigMap's deletion", func() bool { return rec.Count(trust.ResultSkipped) > skipped })
	_, err = admin.CoreV1().ConfigMaps("gamma").Get(t.Context(), ConfigMapName, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("ConfigMap in terminating namespace: %v; want NotFound", err)
	}
}

// testSelector runs a publisher for namespaces labelled mesh=on: a
// labelled namespace gets the ConfigMap, and one without the label, once
// the publisher has reconciled it (it logs the skip), has none.
func testSelector(t *testing.T, cp *controlplane.ControlPlane, user kubernetes.Interface, root *x509.Certificate) {
	admin := cp.Client()
	var logs testlog.Buffer
	log := slog.New(slog.NewMultiHandler(testlog.New(t).Handler(), slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	p, err := New(Config{Client: user, NamespaceSelector: labels.SelectorFromSet(labels.Set{"mesh": "on"}), Options: trust.Options{TrustDomain: testTD, Roots: func() []*x509.Certificate { return []*x509.Certificate{root} }, Logger: log}})
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, p)
	if _, err := cp.CreateNamespace(t.Context(), "plain"); err != nil {
		t.Fatal(err)
	}
	meshed := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "meshed", Labels: map[string]string{"mesh": "on"}}}
	if _, err := admin.CoreV1().Namespaces().Create(t.Context(), meshed, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoots(t, admin, "meshed", root)
	testwait.Eventually(t, "namespace plain reconciled", func() bool {
		return strings.Contains(logs.String(), `msg="not publishing ConfigMap" namespace=plain reason="namespace not selected"`)
	})
	_, err = admin.CoreV1().ConfigMaps("plain").Get(t.Context(), ConfigMapName, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("ConfigMap in namespace plain: %v; want NotFound", err)
	}
}

// testNoRBAC runs as a service account without any binding: Run refuses at
// start, naming every permission.
func testNoRBAC(t *testing.T, cp *controlplane.ControlPlane) {
	user := servicePublisher(t, cp, "rootconfigmap-unbound", nil)
	p, err := New(Config{Client: user, Options: trust.Options{TrustDomain: testTD, Roots: func() []*x509.Certificate { return nil }, Logger: testlog.New(t)}})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Run(t.Context())
	if !errors.Is(err, rbac.ErrPermissionDenied) {
		t.Fatalf("Run = %v; want ErrPermissionDenied", err)
	}
	for _, perm := range permissions() {
		if !strings.Contains(err.Error(), perm.String()) {
			t.Errorf("error %q does not name %s", err, perm)
		}
	}
	t.Logf("Run: %v", err)
}
