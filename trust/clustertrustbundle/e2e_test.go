package clustertrustbundle

import (
	"crypto/x509"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/internal/rbac"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testlog"
	"github.com/workload-ca/workload-ca/internal/testwait"
	"github.com/workload-ca/workload-ca/trust"
)

// e2eTimeout bounds every wait for the publisher to converge.
const e2eTimeout = 10 * time.Second

// TestE2E runs publishers against a real kube-apiserver, as users holding
// exactly the RBAC the package documents. The steps share one control
// plane and run in order; each publisher has its own signer.
func TestE2E(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	admin := cp.Client()
	roots := testca.RootCerts(t, 3)
	rs := &testca.Roots{}
	rs.Set(roots[0])
	user := grantPublisher(t, cp, "trustbundle-publisher", DefaultSignerName)
	p, err := New(Config{Client: user, Options: trust.Options{TrustDomain: testTD, Roots: rs.Get, Logger: testlog.New(t)}})
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, p)
	first := hashedName(mustContent(t, roots[0]))

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"publishes name, signer, labels and content", func(t *testing.T) {
			waitBundle(t, admin, first, DefaultSignerName, roots[0])
		}},
		{"re-creates a deleted bundle", func(t *testing.T) {
			if err := admin.CertificatesV1().ClusterTrustBundles().Delete(t.Context(), first, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			waitBundle(t, admin, first, DefaultSignerName, roots[0])
		}},
		{"repairs an edited bundle", func(t *testing.T) {
			testRepairEdit(t, admin, first, roots)
		}},
		{"rotation: new bundle before the old one goes, unowned kept", func(t *testing.T) {
			testRotation(t, admin, p, rs, roots)
		}},
		{"a peer serving our roots gets a bundle of its own", func(t *testing.T) { testPeerSameRoots(t, admin, user, rs) }},
		{"istio-compatible", func(t *testing.T) { testIstio(t, cp) }},
		{"pod with clusterTrustBundle volumes accepted", func(t *testing.T) { testPodAccepted(t, cp) }},
		{"no attest permission", func(t *testing.T) { testNoAttest(t, cp) }},
		{"SelectRoots reads another signer's bundles by label", func(t *testing.T) { testSelectRoots(t, admin, roots) }},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			t.FailNow() // later steps build on earlier ones
		}
	}
}

// testRepairEdit replaces the bundle's content and drops a label.
func testRepairEdit(t *testing.T, admin kubernetes.Interface, name string, roots []*x509.Certificate) {
	bundles := admin.CertificatesV1().ClusterTrustBundles()
	b, err := bundles.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.Spec.TrustBundle = mustContent(t, roots[2])
	delete(b.Labels, LabelManagedBy)
	if _, err := bundles.Update(t.Context(), b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitBundle(t, admin, name, DefaultSignerName, roots[0])
}

// testRotation adds a root and checks, on a watch, that the bundle with
// both roots is added before the one with the old root is deleted, and
// that a bundle we do not own survives.
func testRotation(t *testing.T, admin kubernetes.Interface, p *Publisher, rs *testca.Roots, roots []*x509.Certificate) {
	ctx := t.Context()
	bundles := admin.CertificatesV1().ClusterTrustBundles()
	manual := bundle("workload-ca.io:spiffe:manual", DefaultSignerName, mustContent(t, roots[2]), nil)
	if _, err := bundles.Create(ctx, manual, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sel := fields.OneTermEqualSelector("spec.signerName", DefaultSignerName).String()
	list, err := bundles.List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	w, err := bundles.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	old, both := hashedName(mustContent(t, roots[0])), hashedName(mustContent(t, roots[0], roots[1]))
	rs.Set(roots[1], roots[0])
	p.Trigger()
	var events []string
	timeout := time.After(e2eTimeout)
	for !strings.Contains(strings.Join(events, ","), "DELETED "+old) {
		select {
		case ev := <-w.ResultChan():
			if b, ok := ev.Object.(*certv1.ClusterTrustBundle); ok {
				events = append(events, string(ev.Type)+" "+b.Name)
			}
		case <-timeout:
			t.Fatalf("old bundle not deleted; events: %v", events)
		}
	}
	added := strings.Index(strings.Join(events, ","), "ADDED "+both)
	if added < 0 || added > strings.Index(strings.Join(events, ","), "DELETED "+old) {
		t.Fatalf("events %v: want ADDED %s before DELETED %s", events, both, old)
	}
	waitBundle(t, admin, both, DefaultSignerName, roots[0], roots[1])
	if _, err := bundles.Get(ctx, manual.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("unowned bundle: %v", err)
	}
}

// testIstio checks the bundle Istio's charts mount by name, and what
// happens when istiod's own publisher writes its root into it: the first
// write is undone at once and istiod's field manager logged; the second,
// right after, stands until the repair interval has passed.
func testIstio(t *testing.T, cp *controlplane.ControlPlane) {
	roots := testca.RootCerts(t, 2)
	ours := roots[:1]
	signer := "istio-e2e.workload-ca.io/spiffe"
	user := grantPublisher(t, cp, "trustbundle-istio", signer, IstioSignerName)
	var logs testlog.Buffer
	const interval = 3 * time.Second
	p, err := New(Config{Client: user, SignerName: signer, IstioCompatible: true, Options: trust.Options{TrustDomain: testTD, Roots: func() []*x509.Certificate { return ours }, Logger: slog.New(slog.NewMultiHandler(testlog.New(t).Handler(), slog.NewTextHandler(&logs, nil))), RepairInterval: interval}})
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, p)
	waitBundle(t, cp.Client(), IstioBundleName, IstioSignerName, ours...)
	waitBundle(t, cp.Client(), target{signer: signer}.name(mustContent(t, ours...)), signer, ours...)

	bundles := cp.Client().CertificatesV1().ClusterTrustBundles()
	istiod := func() {
		t.Helper()
		b, err := bundles.Get(t.Context(), IstioBundleName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b.Spec.TrustBundle = mustContent(t, roots[1])
		if _, err := bundles.Update(t.Context(), b, metav1.UpdateOptions{FieldManager: "pilot-discovery"}); err != nil {
			t.Fatal(err)
		}
	}
	// The first repair comes after this moment, so the interval since it
	// is at most the time since now.
	first := time.Now()
	istiod()
	waitBundle(t, cp.Client(), IstioBundleName, IstioSignerName, ours...)
	if !strings.Contains(logs.String(), "another writer changed the roots in the ClusterTrustBundle") || !strings.Contains(logs.String(), "pilot-discovery") {
		t.Fatalf("the repair was not logged with istiod's field manager:\n%s", logs.String())
	}
	istiod()
	waitBundle(t, cp.Client(), IstioBundleName, IstioSignerName, ours...)
	if d := time.Since(first); d < interval-time.Second {
		t.Errorf("the second change was undone %v after the first one was made, within the %v repair interval", d, interval)
	}
}

// testPodAccepted creates a pod mounting our bundles by signer and label
// selector, and Istio's by name; the apiserver validates the volume (no
// kubelet runs) and must keep it (the projection feature gate is on).
func testPodAccepted(t *testing.T, cp *controlplane.ControlPlane) {
	ctx := t.Context()
	signer := DefaultSignerName
	if _, err := cp.CreateNamespace(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.CreateServiceAccount(ctx, "app", "app"); err != nil {
		t.Fatal(err)
	}
	sources := []corev1.VolumeProjection{
		{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{
			SignerName:    &signer,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelTrustDomain: testTD.Name()}},
			Path:          "bundle.pem",
		}},
		{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{Name: new(IstioBundleName), Path: "root-cert.pem"}},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "app"},
		Spec: corev1.PodSpec{
			ServiceAccountName: "app",
			Containers: []corev1.Container{{Name: "app", Image: controlplane.PauseImage,
				VolumeMounts: []corev1.VolumeMount{{Name: "spiffe-bundle", MountPath: "/var/run/spiffe"}}}},
			Volumes: []corev1.Volume{{Name: "spiffe-bundle",
				VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: sources}}}},
		},
	}
	got, err := cp.Client().CoreV1().Pods("app").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("pod with clusterTrustBundle volume rejected: %v", err)
	}
	for _, v := range got.Spec.Volumes {
		if v.Name == "spiffe-bundle" && len(v.Projected.Sources) == 2 &&
			v.Projected.Sources[0].ClusterTrustBundle != nil && v.Projected.Sources[1].ClusterTrustBundle != nil {
			return
		}
	}
	t.Fatalf("clusterTrustBundle sources dropped from the stored pod: %+v", got.Spec.Volumes)
}

// testNoAttest runs as a user who may write ClusterTrustBundles but not
// attest for the signer: Run refuses at start, naming the permission, and
// the apiserver itself refuses the create.
func testNoAttest(t *testing.T, cp *controlplane.ControlPlane) {
	signer := "noattest.workload-ca.io/spiffe"
	user := grantPublisher(t, cp, "trustbundle-noattest")
	roots := testca.RootCerts(t, 1)
	p, err := New(Config{Client: user, SignerName: signer, Options: trust.Options{TrustDomain: testTD, Roots: func() []*x509.Certificate { return roots }, Logger: testlog.New(t)}})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Run(t.Context())
	if !errors.Is(err, rbac.ErrPermissionDenied) || !strings.Contains(err.Error(), `attest on signers, resourceName "`+signer+`"`) ||
		strings.Contains(err.Error(), "on clustertrustbundles") {
		t.Fatalf("Run = %v; want ErrPermissionDenied naming only attest on %s", err, signer)
	}
	t.Logf("Run: %v", err)
	// Without the start-up check, reconcile meets the admission plugin.
	_, err = newRun(p, v1API(user)).reconcile(t.Context(), signer)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "not permitted to attest") {
		t.Fatalf("reconcile = %v; want Forbidden: not permitted to attest", err)
	}
	t.Logf("reconcile: %v", err)
}

// TestE2EV1beta1 runs against an apiserver serving ClusterTrustBundles in
// v1beta1 only (as 1.33-1.36 with the beta enabled).
func TestE2EV1beta1(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{ExtraAPIServerFlags: map[string]string{
		"runtime-config": "certificates.k8s.io/v1/clustertrustbundles=false,certificates.k8s.io/v1beta1/clustertrustbundles=true",
	}})
	roots := testca.RootCerts(t, 1)
	p, err := New(Config{Client: cp.Client(), Options: trust.Options{TrustDomain: testTD, Roots: func() []*x509.Certificate { return roots }, Logger: testlog.New(t)}})
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, p)
	name := hashedName(mustContent(t, roots...))
	bundles := cp.Client().CertificatesV1beta1().ClusterTrustBundles()
	present := func() bool {
		b, err := bundles.Get(t.Context(), name, metav1.GetOptions{})
		return err == nil && b.Spec.SignerName == DefaultSignerName && trust.HasLabels(b.Labels, liveLabels(testTD, testTD))
	}
	testwait.Eventually(t, "v1beta1 bundle "+name, present)
	if err := bundles.Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "v1beta1 bundle re-created", present)
}

// testSelectRoots: the roots of another signer's bundles that carry the
// labels asked for, as a federation source reads them.
func testSelectRoots(t *testing.T, admin kubernetes.Interface, roots []*x509.Certificate) {
	const signer = "other.example/ca"
	for i, team := range []string{"a", "b"} {
		b := bundle(signerPrefix(signer)+team, signer, mustContent(t, roots[i+1]), map[string]string{"team": team})
		if _, err := admin.CertificatesV1().ClusterTrustBundles().Create(t.Context(), b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		labels map[string]string
		want   []*x509.Certificate
	}{
		{map[string]string{"team": "a"}, roots[1:2]},
		{nil, roots[1:3]},
		{map[string]string{"team": "c"}, nil},
	} {
		got, err := SelectRoots(t.Context(), admin, signer, tc.labels)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(tc.want) || (len(got) > 0 && !slices.ContainsFunc(got, tc.want[0].Equal)) {
			t.Errorf("SelectRoots(%v) = %d roots, want %d", tc.labels, len(got), len(tc.want))
		}
	}
}

// testPeerSameRoots, against the API server: a peer serving our roots is
// published under a name of its own (which the API server accepts for our
// signer), and our bundle keeps our labels.
func testPeerSameRoots(t *testing.T, admin, user kubernetes.Interface, rs *testca.Roots) {
	peer := spiffeid.RequireTrustDomainFromString("east.example")
	p, err := New(Config{Client: user, PeerTrustDomain: peer, Options: trust.Options{TrustDomain: testTD, Roots: rs.Get, Logger: testlog.New(t)}})
	if err != nil {
		t.Fatal(err)
	}
	stop := testwait.Run(t, p.Run)
	content := mustContent(t, rs.Get()...)
	name := target{signer: DefaultSignerName, peer: peer}.name(content)
	testwait.Eventually(t, "the peer's bundle", func() bool {
		b, err := admin.CertificatesV1().ClusterTrustBundles().Get(t.Context(), name, metav1.GetOptions{})
		return err == nil && b.Spec.TrustBundle == content && trust.HasLabels(b.Labels, liveLabels(testTD, peer))
	})
	waitBundle(t, admin, hashedName(content), DefaultSignerName, rs.Get()...)
	stop()
	if err := admin.CertificatesV1().ClusterTrustBundles().Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
