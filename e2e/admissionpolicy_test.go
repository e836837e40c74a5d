package e2e_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/workload-ca/workload-ca/internal/testca"
)

// istiodUser is the writer the exclusive policies keep out: istiod's
// service account, impersonated with system:masters so that RBAC allows
// everything and any refusal is the policies'.
const istiodUser = "system:serviceaccount:istio-system:istiod"

// Dry runs write nothing; admission, the policies included, still runs.
var (
	dryCreate = metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	dryUpdate = metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	dryDelete = metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
)

// admissionCase is one write and the policy message it must be refused
// with; an empty message means it must be allowed.
type admissionCase struct {
	name    string
	write   func(ctx context.Context) error
	refused string
}

// caClient returns a client acting as the chart's service account.
func caClient(t *testing.T, s *suite, rel chartRelease) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(s.cp.ServiceAccountConfig(rel.ns, rel.serviceAccount))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// istiodClient returns a client acting as istiod (see istiodUser).
func istiodClient(t *testing.T, s *suite) kubernetes.Interface {
	return superuserClient(t, s, istiodUser)
}

// superuserClient returns a client acting as user in system:masters, so
// that RBAC allows everything and any refusal is a policy's.
func superuserClient(t *testing.T, s *suite, user string) kubernetes.Interface {
	t.Helper()
	cfg := s.cp.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:masters", "system:authenticated"}}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitForPolicies waits until each rendered policy refuses a write it
// exists to refuse: a policy takes effect a moment after it is created.
// (Its type-check status is written by kube-controller-manager, which this
// control plane does not run; an expression that fails at run time would
// refuse the writes that checkOwnWrites and checkExclusive require to
// pass, since the policies fail closed.)
func waitForPolicies(t *testing.T, s *suite, rel chartRelease) {
	t.Helper()
	ca, istiod := caClient(t, s, rel), istiodClient(t, s)
	root := string(testca.NewRoot(t, testca.P256).CertPEM())
	createMeshNamespace(t, s, rel, policyNS) // the root ConfigMap policy binds only there
	probes := []admissionCase{
		{"own-writes", func(ctx context.Context) error { return createConfigMap(ctx, ca, "default", "wca-policy-probe") },
			"only ConfigMaps named istio-ca-root-cert"},
		{"trust-bundles", func(ctx context.Context) error { return createBundle(ctx, ca, "wca-policy-probe", "", root) },
			"only ClusterTrustBundles of its signers"},
		{"root-configmaps", func(ctx context.Context) error { return createConfigMap(ctx, istiod, policyNS, rootConfigMap) },
			"may not create it or change its data"},
	}
	if len(probes) != len(rel.policies) {
		t.Fatalf("%d probes for the policies %q", len(probes), rel.policies)
	}
	for _, p := range probes {
		waitForPolicy(t, p)
	}
}

// waitForPolicy repeats probe's write until a policy refuses it as probe
// says: a policy takes effect a moment after it is created.
func waitForPolicy(t *testing.T, probe admissionCase) {
	t.Helper()
	var last error
	err := pollUntil(t, 30*time.Second, func() (bool, error) {
		last = probe.write(t.Context())
		return refusedBy(last, probe.refused), nil
	})
	if err != nil {
		t.Fatalf("policy %s never took effect (last: %v)", probe.name, last)
	}
}

// checkOwnWrites shows that the policies narrow what the chart's RBAC
// grants the CA: create cannot be limited by name in RBAC, and a bundle
// without a signer passes the attest check.
func checkOwnWrites(t *testing.T, s *suite, rel chartRelease) {
	ca := caClient(t, s, rel)
	root := string(testca.NewRoot(t, testca.P256).CertPEM())
	leases := ca.CoordinationV1().Leases(rel.ns)
	secrets := ca.CoreV1().Secrets(rel.ns)
	runAdmissionCases(t, []admissionCase{
		{"Istio's root ConfigMap where it publishes it", func(ctx context.Context) error { return createConfigMap(ctx, ca, policyNS, rootConfigMap) }, ""},
		{"Istio's root ConfigMap where it does not", func(ctx context.Context) error { return createConfigMap(ctx, ca, "default", rootConfigMap) },
			"only ConfigMaps named istio-ca-root-cert, in namespaces labelled"},
		{"a ConfigMap of another name", func(ctx context.Context) error { return createConfigMap(ctx, ca, "default", "coredns-custom") },
			"only ConfigMaps named istio-ca-root-cert"},
		{"another ConfigMap in kube-system", func(ctx context.Context) error { return createConfigMap(ctx, ca, "kube-system", "coredns-custom") },
			"only ConfigMaps named istio-ca-root-cert"},
		{"its Lease", func(ctx context.Context) error { return createLease(ctx, leases, rel.lease) }, ""},
		{"another Lease", func(ctx context.Context) error { return createLease(ctx, leases, "kube-scheduler") },
			"only its own Lease"},
		{"its CA Secret", func(ctx context.Context) error { return createSecret(ctx, secrets, rel.caSecret) }, ""},
		{"another Secret", func(ctx context.Context) error { return createSecret(ctx, secrets, "other") },
			"only its own Secret"},
		{"istiod's certificate Secret", func(ctx context.Context) error {
			return createSecret(ctx, ca.CoreV1().Secrets(rel.istiodNS), rel.istiodSecret)
		}, ""},
		{"another Secret in istiod's namespace", func(ctx context.Context) error {
			return createSecret(ctx, ca.CoreV1().Secrets(rel.istiodNS), "cacerts")
		}, "only its own Secret"},
		{"a bundle of its signer", func(ctx context.Context) error {
			return createBundle(ctx, ca, signerBundleName(rel.signer), rel.signer, root)
		}, ""},
		{"a bundle without a signer", func(ctx context.Context) error { return createBundle(ctx, ca, "wca-unsigned", "", root) },
			"only ClusterTrustBundles of its signers"},
	})
	checkOwnDeletes(t, s, ca, rel, root)
}

// checkOwnDeletes: the chart's RBAC lets the CA delete any
// ClusterTrustBundle (delete cannot be limited by signer in RBAC); the
// policy keeps it to bundles of its own signers.
func checkOwnDeletes(t *testing.T, s *suite, ca kubernetes.Interface, rel chartRelease, root string) {
	t.Helper()
	const otherSigner = "example.com/other"
	foreign := signerBundleName(otherSigner) + "-delete"
	own := signerBundleName(rel.signer) + "-delete"
	admin := s.cp.Client()
	b := &certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: foreign},
		Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: otherSigner, TrustBundle: root}}
	if _, err := admin.CertificatesV1().ClusterTrustBundles().Create(t.Context(), b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	b = &certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: own},
		Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: rel.signer, TrustBundle: root}}
	if _, err := ca.CertificatesV1().ClusterTrustBundles().Create(t.Context(), b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CertificatesV1().ClusterTrustBundles().Delete(context.Background(), foreign, metav1.DeleteOptions{})
		_ = admin.CertificatesV1().ClusterTrustBundles().Delete(context.Background(), own, metav1.DeleteOptions{})
	})
	bundles := ca.CertificatesV1().ClusterTrustBundles()
	if err := bundles.Delete(t.Context(), foreign, dryDelete); !refusedBy(err, "only ClusterTrustBundles of its signers") {
		t.Errorf("the CA deleting another signer's bundle: %v, want Forbidden by the policy", err)
	}
	// The CA's own publisher may have removed a bundle it does not know.
	if err := bundles.Delete(t.Context(), own, dryDelete); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("the CA deleting a bundle of its signer: %v, want allowed", err)
	}
}

// checkExclusive shows that, with admissionPolicy.exclusive, another
// writer (istiod) can neither create nor change the content of what the
// CA publishes, while labels and deletes stay open and what the CA does
// not publish is untouched, in namespaces outside its root ConfigMap
// selector too. It runs while the CA is serving, after it has published
// the root ConfigMap in namespace ns and istio.io:istiod-ca:root-cert.
func checkExclusive(t *testing.T, s *suite, rel chartRelease, ns string) {
	istiod := istiodClient(t, s)
	alsoPublished := ns + "-also"
	createMeshNamespace(t, s, rel, alsoPublished)
	other := string(testca.NewRoot(t, testca.P256).CertPEM())
	cms := istiod.CoreV1().ConfigMaps(ns)
	bundles := istiod.CertificatesV1().ClusterTrustBundles()
	const istioBundle = "istio.io:istiod-ca:root-cert"
	editConfigMap := func(edit func(*corev1.ConfigMap)) func(context.Context) error {
		return dryEdit(cms.Get, cms.Update, rootConfigMap, edit)
	}
	editBundle := func(edit func(*certificatesv1.ClusterTrustBundle)) func(context.Context) error {
		return dryEdit(bundles.Get, bundles.Update, istioBundle, edit)
	}
	const refusedCM, refusedBundle = "may not create it or change its data", "may not create one or change its trustBundle"
	runAdmissionCases(t, []admissionCase{
		{"istiod overwrites root-cert.pem", editConfigMap(func(cm *corev1.ConfigMap) { cm.Data["root-cert.pem"] = other }), refusedCM},
		{"istiod adds a data key", editConfigMap(func(cm *corev1.ConfigMap) { cm.Data["extra.pem"] = other }), refusedCM},
		{"istiod adds binaryData", editConfigMap(func(cm *corev1.ConfigMap) { cm.BinaryData = map[string][]byte{"x": {1}} }), refusedCM},
		{"istiod labels it", editConfigMap(func(cm *corev1.ConfigMap) { metav1.SetMetaDataLabel(&cm.ObjectMeta, "example.org/seen", "yes") }), ""},
		{"istiod deletes it", func(ctx context.Context) error { return cms.Delete(ctx, rootConfigMap, dryDelete) }, ""},
		{"istiod creates it in another namespace the CA publishes to", func(ctx context.Context) error {
			return createConfigMap(ctx, istiod, alsoPublished, rootConfigMap)
		}, refusedCM},
		{"istiod creates it in a namespace the CA does not publish to", func(ctx context.Context) error {
			return createConfigMap(ctx, istiod, "default", rootConfigMap)
		}, ""},
		{"istiod creates another ConfigMap", func(ctx context.Context) error { return createConfigMap(ctx, istiod, ns, "istio") }, ""},
		{"istiod replaces the Istio bundle's roots", editBundle(func(b *certificatesv1.ClusterTrustBundle) { b.Spec.TrustBundle = other }), refusedBundle},
		{"istiod labels the Istio bundle", editBundle(func(b *certificatesv1.ClusterTrustBundle) {
			metav1.SetMetaDataLabel(&b.ObjectMeta, "example.org/seen", "yes")
		}), ""},
		{"istiod deletes the Istio bundle", func(ctx context.Context) error { return bundles.Delete(ctx, istioBundle, dryDelete) }, ""},
		{"istiod creates a bundle of the CA's signer", func(ctx context.Context) error {
			return createBundle(ctx, istiod, signerBundleName(rel.signer), rel.signer, other)
		}, refusedBundle},
		{"istiod creates a bundle of another signer", func(ctx context.Context) error {
			return createBundle(ctx, istiod, signerBundleName("example.com/other"), "example.com/other", other)
		}, ""},
	})

	// For real, not a dry run: the published content survives the attempt.
	cm, err := cms.Get(t.Context(), rootConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := cm.Data["root-cert.pem"]
	cm.Data["root-cert.pem"] = other
	if _, err := cms.Update(t.Context(), cm, metav1.UpdateOptions{}); !refusedBy(err, refusedCM) {
		t.Errorf("istiod's real update: %v, want refused by the policy", err)
	}
	if got, err := cms.Get(t.Context(), rootConfigMap, metav1.GetOptions{}); err != nil || got.Data["root-cert.pem"] != want {
		t.Errorf("after istiod's attempt the ConfigMap holds other roots (err %v)", err)
	}
}

// dryEdit returns a write that reads object name, edits it and updates it
// as a dry run.
func dryEdit[T any](get func(context.Context, string, metav1.GetOptions) (T, error),
	update func(context.Context, T, metav1.UpdateOptions) (T, error), name string, edit func(T)) func(context.Context) error {
	return func(ctx context.Context) error {
		o, err := get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(o)
		_, err = update(ctx, o, dryUpdate)
		return err
	}
}

func runAdmissionCases(t *testing.T, cases []admissionCase) {
	t.Helper()
	for _, c := range cases {
		err := c.write(t.Context())
		switch {
		case c.refused == "" && apierrors.IsAlreadyExists(err):
			// An object of that name exists from an earlier run (go test
			// -count). The API server runs validating admission before it
			// asks storage, so the write was admitted.
		case c.refused == "" && err != nil:
			t.Errorf("%s: %v, want allowed", c.name, err)
		case c.refused != "" && !refusedBy(err, c.refused):
			t.Errorf("%s: %v, want Forbidden by a policy, saying %q", c.name, err, c.refused)
		}
	}
}

// refusedBy reports whether err is a ValidatingAdmissionPolicy's refusal
// whose message holds msg.
func refusedBy(err error, msg string) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy") && strings.Contains(err.Error(), msg)
}

func createConfigMap(ctx context.Context, c kubernetes.Interface, ns, name string) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": "v"}}
	_, err := c.CoreV1().ConfigMaps(ns).Create(ctx, cm, dryCreate)
	return err
}

func createLease(ctx context.Context, c interface {
	Create(context.Context, *coordinationv1.Lease, metav1.CreateOptions) (*coordinationv1.Lease, error)
}, name string) error {
	_, err := c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}, dryCreate)
	return err
}

func createSecret(ctx context.Context, c interface {
	Create(context.Context, *corev1.Secret, metav1.CreateOptions) (*corev1.Secret, error)
}, name string) error {
	_, err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}}, dryCreate)
	return err
}

func createBundle(ctx context.Context, c kubernetes.Interface, name, signer, roots string) error {
	b := &certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: roots}}
	_, err := c.CertificatesV1().ClusterTrustBundles().Create(ctx, b, dryCreate)
	return err
}

// signerBundleName is a bundle name the API server accepts for signer: it
// must start with the signer name, its slash made a colon.
func signerBundleName(signer string) string {
	return strings.ReplaceAll(signer, "/", ":") + ":e2e-dry-run"
}

// checkOwnConfigMapSelector applies, for real, the own-writes policy of a
// release whose root ConfigMap selector uses every requirement form, and
// checks as that release's service account (with RBAC out of the way)
// that creating istio-ca-root-cert is allowed in exactly the namespaces
// the CA's own reading of the selector matches: one that matches, one
// that fails each requirement alone, and ones that pass a requirement
// another way.
func checkOwnConfigMapSelector(t *testing.T, s *suite, helm, kubeVersion string, ap *applier) {
	const ns, sel = "wca-chart-selector", "a in (x, y),c notin (z),!d,e,f!=g,h=="
	var user string
	for _, o := range renderWithRootSelector(t, helm, kubeVersion, "wcasel", ns, sel) {
		switch {
		case o.GetKind() == "ServiceAccount":
			user = "system:serviceaccount:" + ns + ":" + o.GetName()
		case strings.HasSuffix(o.GetName(), "-own-writes"): // the policy and its binding
			if _, err := ap.apply(t.Context(), o, false); err != nil {
				t.Fatalf("apply %s: %v", objName(o), err)
			}
			t.Cleanup(func() {
				if err := ap.delete(context.Background(), o); err != nil {
					t.Errorf("delete %s: %v", objName(o), err)
				}
			})
		}
	}
	ca := superuserClient(t, s, user)
	const refused = "only ConfigMaps named istio-ca-root-cert"
	waitForPolicy(t, admissionCase{"own-writes", func(ctx context.Context) error {
		return createConfigMap(ctx, ca, "default", "wca-policy-probe")
	}, refused})

	want, err := labels.Parse(sel)
	if err != nil {
		t.Fatal(err)
	}
	match := labels.Set{"a": "x", "e": "", "h": ""}
	with := func(k, v string) labels.Set { l := maps.Clone(match); l[k] = v; return l }
	without := func(k string) labels.Set { l := maps.Clone(match); delete(l, k); return l }
	for i, set := range []labels.Set{
		match,
		with("a", "y"), with("a", "z"), without("a"), // in
		with("c", "w"), with("c", "z"), // notin
		with("d", "1"),                 // !exists
		without("e"),                   // exists
		with("f", "h"), with("f", "g"), // !=
		with("h", "1"), without("h"), // ==
	} {
		name := fmt.Sprintf("wca-selector-%02d", i)
		createNamespace(t, s, name, set)
		err := createConfigMap(t.Context(), ca, name, rootConfigMap)
		switch {
		case want.Matches(set) && err != nil:
			t.Errorf("namespace labelled %v: %v, want allowed", set, err)
		case !want.Matches(set) && !refusedBy(err, refused):
			t.Errorf("namespace labelled %v: %v, want refused by the policy", set, err)
		}
	}
}
