package e2e_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/policy"
)

// rbacRelease is what TestChartRBAC installs: ci/full-values.yaml (its own
// signer, istioCompatible, a CA Secret and Lease of their own names) in
// namespace rbacNS.
const (
	rbacNS     = "wca-rbac"
	rbacValues = "ci/full-values.yaml"
	// rootConfigMap is Istio's root ConfigMap, as the chart's RBAC names it.
	rootConfigMap = "istio-ca-root-cert"
	// policyNS is a namespace the chart's root ConfigMap selector
	// matches, created before the CA runs for the admission policies'
	// checks.
	policyNS = "wca-rbac-policy"
)

// chartRelease is what the rendered Deployment says the CA will use: the
// names the RBAC rules must cover.
type chartRelease struct {
	ns, serviceAccount     string
	trustDomain, signer    string
	istioCompatible        bool
	rootConfigMapSelector  string // --istio-root-configmap-namespaces
	caSecretNS, caSecret   string
	istiodNS, istiodSecret string // --istiod-namespace, --istiod-cert-secret
	leaseNS, lease         string
	args                   []string
	clusterRole, role      *unstructured.Unstructured
	clusterBinding, roleBd *unstructured.Unstructured
	istiodRole, istiodBd   *unstructured.Unstructured
	policies               []string // ValidatingAdmissionPolicy names
}

// TestChartRBAC applies the chart's ServiceAccount, roles and bindings for
// real and shows with SubjectAccessReviews that they grant what the CA
// needs and deny what it does not; that ClusterTrustBundle admission (the
// attest check) keeps the service account to its own signers; that the
// chart's ValidatingAdmissionPolicies narrow what RBAC cannot and keep
// other writers off what the CA publishes; and that the
// real `workload-ca serve`, authenticated as that service account with the
// chart's own flags, becomes ready, leads, publishes its bundles and issues
// certificates.
func TestChartRBAC(t *testing.T) {
	s := suiteFor(t)
	helm := helmBinary(t)
	createNamespace(t, s, rbacNS, restrictedPSS)
	objs := renderChart(t, helm, "wca", rbacNS, serverVersion(t, s), rbacValues)
	rel := releaseOf(t, objs)
	ap := newApplier(t, s.cp.RESTConfig())
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
			"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			if _, err := ap.apply(t.Context(), o, false); err != nil {
				t.Fatalf("apply %s: %v", objName(o), err)
			}
			if o.GetNamespace() == "" {
				t.Cleanup(func() {
					if err := ap.delete(context.Background(), o); err != nil {
						t.Errorf("delete %s: %v", objName(o), err)
					}
				})
			}
		}
	}

	waitForPolicies(t, s, rel)

	t.Run("the rules are exactly the ones the CA needs", func(t *testing.T) { checkRules(t, rel) })
	t.Run("SubjectAccessReviews", func(t *testing.T) { checkAccessReviews(t, s, rel) })
	t.Run("ClusterTrustBundle admission allows only our signers", func(t *testing.T) { checkBundleAdmission(t, s, rel) })
	t.Run("admission policies hold the CA to the objects it owns", func(t *testing.T) { checkOwnWrites(t, s, rel) })
	tests := renderChartTests(t, helm, "wca", rbacNS, serverVersion(t, s), rbacValues)
	t.Run("workload-ca serve runs as the service account", func(t *testing.T) { runAsServiceAccount(t, s, rel, objs, tests) })
}

// releaseOf reads the names the CA will use from the rendered Deployment.
func releaseOf(t *testing.T, objs []*unstructured.Unstructured) chartRelease {
	t.Helper()
	rel := chartRelease{ns: rbacNS, args: deploymentArgs(t, objs),
		clusterRole: findObject(t, objs, "ClusterRole"), role: findIn(t, objs, "Role", rbacNS),
		clusterBinding: findObject(t, objs, "ClusterRoleBinding"), roleBd: findIn(t, objs, "RoleBinding", rbacNS)}
	rel.serviceAccount = findObject(t, objs, "ServiceAccount").GetName()
	for _, o := range objs {
		if o.GetKind() == "ValidatingAdmissionPolicy" {
			rel.policies = append(rel.policies, o.GetName())
		}
	}
	if len(rel.policies) != 3 {
		t.Fatalf("%s renders the policies %q; it should set admissionPolicy.exclusive, so that all three are tested", rbacValues, rel.policies)
	}
	flag := func(name string) string {
		for _, a := range rel.args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		t.Fatalf("the Deployment has no --%s", name)
		return ""
	}
	rel.trustDomain, rel.signer = flag("trust-domain"), flag("signer-name")
	rel.istioCompatible = flag("istio-compatible") == "true"
	if flag("istio-root-configmap") != "true" {
		t.Fatalf("%s should set istioRootConfigMap.enabled, so that its rules are tested", rbacValues)
	}
	rel.rootConfigMapSelector = flag("istio-root-configmap-namespaces")
	var ok bool
	if rel.caSecretNS, rel.caSecret, ok = strings.Cut(flag("ca-secret"), "/"); !ok {
		t.Fatalf("--ca-secret %q is not namespace/name", flag("ca-secret"))
	}
	if flag("istiod-cert") != "true" {
		t.Fatalf("%s should set istiodCertificate.enabled, so that its rules are tested", rbacValues)
	}
	rel.istiodNS, rel.istiodSecret = flag("istiod-namespace"), flag("istiod-cert-secret")
	rel.istiodRole, rel.istiodBd = findIn(t, objs, "Role", rel.istiodNS), findIn(t, objs, "RoleBinding", rel.istiodNS)
	rel.leaseNS, rel.lease = flag("leader-election-namespace"), flag("leader-election-id")
	if rel.caSecretNS != rbacNS || rel.leaseNS != rbacNS {
		t.Fatalf("CA Secret in %q and Lease in %q, want the release namespace %q", rel.caSecretNS, rel.leaseNS, rbacNS)
	}
	if !rel.istioCompatible {
		t.Fatalf("%s should set trustBundle.istioCompatible, so that both attest names are tested", rbacValues)
	}
	return rel
}

// checkRules pins the rendered rules: any widening must change this test.
func checkRules(t *testing.T, rel chartRelease) {
	var cr rbacv1.ClusterRole
	var r rbacv1.Role
	var crb rbacv1.ClusterRoleBinding
	var rb rbacv1.RoleBinding
	var ir rbacv1.Role
	var irb rbacv1.RoleBinding
	for _, c := range []struct {
		from *unstructured.Unstructured
		to   any
	}{{rel.clusterRole, &cr}, {rel.role, &r}, {rel.clusterBinding, &crb}, {rel.roleBd, &rb}, {rel.istiodRole, &ir}, {rel.istiodBd, &irb}} {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(c.from.Object, c.to); err != nil {
			t.Fatal(err)
		}
	}
	signers := []string{rel.signer, "istio.io/istiod-ca"}
	wantCluster := []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"selfsubjectaccessreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"clustertrustbundles"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"}, Verbs: []string{"attest"}, ResourceNames: signers},
		{APIGroups: []string{"workload-ca.io"}, Resources: []string{"issuancepolicies"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"workload-ca.io"}, Resources: []string{"issuancepolicies/status"}, Verbs: []string{"update"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces", "nodes"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"podcertificaterequests"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"podcertificaterequests/status"}, Verbs: []string{"update"}},
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"}, Verbs: []string{"sign"}, ResourceNames: []string{rel.signer}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "update"}, ResourceNames: []string{rootConfigMap}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list", "watch"}},
	}
	wantNS := []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "update"}, ResourceNames: []string{rel.lease}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch", "update"}, ResourceNames: []string{rel.caSecret}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
	}
	if d := cmp.Diff(wantCluster, cr.Rules); d != "" {
		t.Errorf("ClusterRole rules (-want +got):\n%s", d)
	}
	if d := cmp.Diff(wantNS, r.Rules); d != "" {
		t.Errorf("Role rules (-want +got):\n%s", d)
	}
	wantIstiod := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch", "update"}, ResourceNames: []string{rel.istiodSecret}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
	}
	if d := cmp.Diff(wantIstiod, ir.Rules); d != "" {
		t.Errorf("Role rules in istiod's namespace (-want +got):\n%s", d)
	}
	wantSubjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: rel.serviceAccount, Namespace: rel.ns}}
	if d := cmp.Diff(wantSubjects, crb.Subjects); d != "" || crb.RoleRef.Name != cr.Name {
		t.Errorf("ClusterRoleBinding to %s, subjects (-want +got):\n%s", crb.RoleRef.Name, d)
	}
	if d := cmp.Diff(wantSubjects, rb.Subjects); d != "" || rb.RoleRef.Name != r.Name || rb.Namespace != rel.ns {
		t.Errorf("RoleBinding %s/%s to %s, subjects (-want +got):\n%s", rb.Namespace, rb.Name, rb.RoleRef.Name, d)
	}
	if d := cmp.Diff(wantSubjects, irb.Subjects); d != "" || irb.RoleRef.Name != ir.Name || irb.Namespace != rel.istiodNS {
		t.Errorf("RoleBinding %s/%s to %s, subjects (-want +got):\n%s", irb.Namespace, irb.Name, irb.RoleRef.Name, d)
	}
}

// access is one SubjectAccessReview question.
type access struct {
	verb, group, resource, subresource, ns, name string
}

func (a access) String() string {
	s := a.verb + " " + a.resource
	if a.subresource != "" {
		s += "/" + a.subresource
	}
	if a.group != "" {
		s += "." + a.group
	}
	if a.name != "" {
		s += " " + a.name
	}
	if a.ns != "" {
		s += " in " + a.ns
	} else {
		s += " (cluster-wide)"
	}
	return s
}

func checkAccessReviews(t *testing.T, s *suite, rel chartRelease) {
	ns, secret, lease := rel.ns, rel.caSecret, rel.lease
	const cert, coord = "certificates.k8s.io", "coordination.k8s.io"
	allowed := []access{
		{verb: "create", group: "authentication.k8s.io", resource: "tokenreviews"},
		{verb: "create", group: "authorization.k8s.io", resource: "selfsubjectaccessreviews"},
		{verb: "list", resource: "pods"},
		{verb: "watch", resource: "pods"},
		{verb: "get", resource: "pods", ns: "demo", name: "web-0"},
		{verb: "list", resource: "serviceaccounts"},
		{verb: "watch", resource: "serviceaccounts"},
		{verb: "create", group: cert, resource: "clustertrustbundles"},
		{verb: "update", group: cert, resource: "clustertrustbundles", name: "istio.io:istiod-ca:root-cert"},
		{verb: "delete", group: cert, resource: "clustertrustbundles", name: "x"},
		{verb: "list", group: cert, resource: "clustertrustbundles"},
		{verb: "watch", group: cert, resource: "clustertrustbundles"},
		{verb: "attest", group: cert, resource: "signers", name: rel.signer},
		{verb: "attest", group: cert, resource: "signers", name: "istio.io/istiod-ca"},
		{verb: "list", group: cert, resource: "podcertificaterequests"},
		{verb: "watch", group: cert, resource: "podcertificaterequests"},
		{verb: "update", group: cert, resource: "podcertificaterequests", subresource: "status", ns: "demo", name: "web-0-pcr"},
		{verb: "sign", group: cert, resource: "signers", name: rel.signer},
		{verb: "get", group: coord, resource: "leases", ns: ns, name: lease},
		{verb: "update", group: coord, resource: "leases", ns: ns, name: lease},
		{verb: "create", group: coord, resource: "leases", ns: ns},
		{verb: "get", resource: "secrets", ns: ns, name: secret},
		{verb: "update", resource: "secrets", ns: ns, name: secret},
		// list and watch with the field selector metadata.name=<secret>,
		// which the apiserver authorizes as a request for that name.
		{verb: "list", resource: "secrets", ns: ns, name: secret},
		{verb: "watch", resource: "secrets", ns: ns, name: secret},
		{verb: "create", resource: "secrets", ns: ns},
		// Istio's root ConfigMap in any namespace, by name (list and watch
		// with the field selector metadata.name=istio-ca-root-cert).
		{verb: "get", resource: "configmaps", ns: "demo", name: rootConfigMap},
		{verb: "update", resource: "configmaps", ns: "demo", name: rootConfigMap},
		{verb: "list", resource: "configmaps", name: rootConfigMap},
		{verb: "watch", resource: "configmaps", name: rootConfigMap},
		{verb: "create", resource: "configmaps", ns: "demo"},
		{verb: "list", resource: "namespaces"},
		{verb: "watch", resource: "namespaces"},
		// istiod's serving certificate Secret, in istiod's namespace only.
		{verb: "get", resource: "secrets", ns: rel.istiodNS, name: rel.istiodSecret},
		{verb: "update", resource: "secrets", ns: rel.istiodNS, name: rel.istiodSecret},
		{verb: "list", resource: "secrets", ns: rel.istiodNS, name: rel.istiodSecret},
		{verb: "watch", resource: "secrets", ns: rel.istiodNS, name: rel.istiodSecret},
		{verb: "create", resource: "secrets", ns: rel.istiodNS},
	}
	denied := []access{
		{verb: "get", resource: "secrets", ns: rel.istiodNS, name: "istio-ca-secret"},
		{verb: "update", resource: "secrets", ns: rel.istiodNS, name: "cacerts"},
		{verb: "list", resource: "secrets", ns: rel.istiodNS},
		{verb: "delete", resource: "secrets", ns: rel.istiodNS, name: rel.istiodSecret},
		{verb: "get", resource: "secrets", ns: "demo", name: rel.istiodSecret},
		{verb: "get", resource: "secrets", ns: "demo", name: secret},
		{verb: "get", resource: "secrets", ns: "kube-system", name: secret},
		{verb: "list", resource: "secrets", ns: "kube-system"},
		{verb: "list", resource: "secrets"},
		{verb: "list", resource: "secrets", ns: ns},  // every Secret in our namespace
		{verb: "watch", resource: "secrets", ns: ns}, // likewise
		{verb: "get", resource: "secrets", ns: ns, name: "someone-elses"},
		{verb: "update", resource: "secrets", ns: ns, name: "someone-elses"},
		{verb: "delete", resource: "secrets", ns: ns, name: secret},
		{verb: "create", resource: "secrets", ns: "demo"},
		{verb: "attest", group: cert, resource: "signers", name: "example.com/other"},
		{verb: "attest", group: cert, resource: "signers", name: "workload-ca.io/spiffe"}, // the default signer, not this release's
		{verb: "attest", group: cert, resource: "signers", name: strings.Split(rel.signer, "/")[0] + "/*"},
		{verb: "attest", group: cert, resource: "signers", name: "kubernetes.io/kube-apiserver-serving"},
		{verb: "sign", group: cert, resource: "signers", name: "istio.io/istiod-ca"},
		{verb: "sign", group: cert, resource: "signers", name: "kubernetes.io/kube-apiserver-client-pod"},
		{verb: "update", group: cert, resource: "podcertificaterequests", ns: "demo", name: "web-0-pcr"},
		{verb: "create", group: cert, resource: "podcertificaterequests", ns: "demo"},
		{verb: "deletecollection", group: cert, resource: "clustertrustbundles"},
		{verb: "patch", group: cert, resource: "clustertrustbundles", name: "x"},
		{verb: "delete", resource: "pods", ns: "demo", name: "web-0"},
		{verb: "create", resource: "pods", ns: "demo"},
		{verb: "update", resource: "pods", ns: "demo", name: "web-0"},
		{verb: "create", resource: "pods", subresource: "exec", ns: "demo", name: "web-0"},
		{verb: "create", resource: "serviceaccounts", subresource: "token", ns: "istio-system", name: "ztunnel"},
		{verb: "get", group: coord, resource: "leases", ns: ns, name: "someone-elses"},
		{verb: "update", group: coord, resource: "leases", ns: ns, name: "someone-elses"},
		{verb: "create", group: coord, resource: "leases", ns: "kube-system"},
		{verb: "get", group: coord, resource: "leases", ns: "kube-system", name: lease},
		{verb: "get", resource: "nodes", name: "node-a"},
		{verb: "list", resource: "configmaps", ns: ns},
		{verb: "list", resource: "configmaps"}, // every ConfigMap
		{verb: "get", resource: "configmaps", ns: "kube-system", name: "someone-elses"},
		{verb: "update", resource: "configmaps", ns: "demo", name: "someone-elses"},
		{verb: "delete", resource: "configmaps", ns: "demo", name: rootConfigMap},
		{verb: "get", resource: "namespaces", name: "demo"},
		{verb: "create", resource: "namespaces"},
		{verb: "create", group: "certificates.k8s.io", resource: "certificatesigningrequests"},
		{verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews"},
		{verb: "impersonate", resource: "serviceaccounts", ns: "istio-system", name: "ztunnel"},
	}
	user := "system:serviceaccount:" + rel.ns + ":" + rel.serviceAccount
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + rel.ns, "system:authenticated"}
	for _, c := range []struct {
		want bool
		list []access
	}{{true, allowed}, {false, denied}} {
		for _, a := range c.list {
			review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, Groups: groups,
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource,
					Namespace: a.ns, Name: a.name,
				},
			}}
			got, err := s.cp.Client().AuthorizationV1().SubjectAccessReviews().Create(t.Context(), review, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("%s: %v", a, err)
			}
			if got.Status.Allowed != c.want {
				t.Errorf("%s: allowed=%v, want %v (reason %q)", a, got.Status.Allowed, c.want, got.Status.Reason)
			}
		}
	}
	t.Logf("checked %d cases that must be allowed and %d that must be denied for %s", len(allowed), len(denied), user)
}

// checkBundleAdmission creates ClusterTrustBundles as the service account
// (server-side dry run): RBAC lets it create any bundle, and the
// ClusterTrustBundleAttest admission plugin refuses a signer it may not
// attest for.
func checkBundleAdmission(t *testing.T, s *suite, rel chartRelease) {
	client := caClient(t, s, rel)
	root := string(testca.NewRoot(t, testca.P256).CertPEM())
	create := func(signer string) error {
		return createBundle(t.Context(), client, signerBundleName(signer), signer, root)
	}
	for _, signer := range []string{rel.signer, "istio.io/istiod-ca"} {
		if err := create(signer); err != nil {
			t.Errorf("bundle of signer %s: %v", signer, err)
		}
	}
	for _, signer := range []string{"example.com/other", "workload-ca.io/spiffe", "kubernetes.io/kube-apiserver-serving"} {
		if err := create(signer); !apierrors.IsForbidden(err) {
			t.Errorf("bundle of signer %s: %v, want Forbidden by the attest check", signer, err)
		}
	}
	// A bundle without a signer passes RBAC and the attest check; the
	// chart's admission policy refuses it (checkOwnWrites).
}

// runAsServiceAccount runs the real CA with the chart's flags under a
// kubeconfig holding a token of the chart's service account.
func runAsServiceAccount(t *testing.T, s *suite, rel chartRelease, objs, tests []*unstructured.Unstructured) {
	known := knownServeFlags(t)
	// helm install installs the chart's CRDs (crds/) before its objects.
	// One policy, which selects nothing, starts the policy metrics the
	// chart's alert reads.
	ensurePolicyCRD(t, s)
	createPolicy(t, s, &policy.IssuancePolicy{ObjectMeta: metav1.ObjectMeta{Name: rel.ns + "-selects-nothing"},
		Spec: policy.Spec{DryRun: true, Match: policy.Match{Clusters: []string{"no-such-cluster"}}}})
	kubeconfig := serviceAccountKubeconfig(t, s, rel.ns, rel.serviceAccount)

	// The chart's flags, less those the harness sets itself (addresses,
	// the serving name it dials, the kubeconfig).
	var extra []string
	var caSecret string
	for _, a := range rel.args {
		name, _ := flagName(a)
		switch name {
		case "listen-addr", "admin-addr", "serving-dns-names", "kubeconfig":
			continue
		case "federation-config":
			// A file the pod mounts from the chart's ConfigMap, naming
			// bundle files there: here one federated trust domain from a
			// file (TestFederation runs endpoints and fetches).
			cfg := filepath.Join(t.TempDir(), "federation.yaml")
			peer := testca.WritePEM(t, testca.NewRoot(t, testca.P256).Cert)
			if err := os.WriteFile(cfg, []byte("trustDomains: [{trustDomain: east.example.org, bundleFile: "+peer+"}]\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			extra = append(extra, "--federation-config="+cfg)
			continue
		case "ca-secret":
			_, caSecret, _ = strings.Cut(a, "=")
			extra = append(extra, "--ca-secret", caSecret) // as cahost expects it
			continue
		}
		if !known[name] {
			t.Fatalf("the chart renders --%s, which this workload-ca does not know", name)
		}
		extra = append(extra, a)
	}

	// Registered first, so it runs after the CA has stopped.
	t.Cleanup(func() { deleteSignerBundles(t, s, rel.signer) })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ca, err := cahost.Start(ctx, cahost.Options{Kubeconfig: kubeconfig, WorkDir: t.TempDir(), ExtraArgs: extra})
	if err != nil {
		t.Fatalf("workload-ca as %s/%s: %v", rel.ns, rel.serviceAccount, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("CA log (last 40 lines):\n%s", lastLines(ca.Logs(), 40))
		}
		if err := ca.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})

	t.Logf("workload-ca as %s/%s: start→SERVING in %v", rel.ns, rel.serviceAccount, ca.StartupTime().Round(time.Millisecond))

	// Issue and deny as in the suite, in the chart's trust domain.
	td := "spiffe://" + rel.trustDomain
	for _, c := range []struct {
		identity string
		want     codes.Code
	}{
		{td + "/ns/demo/sa/web", codes.OK},                                // pod on ztunnel's node
		{td + "/ns/demo/sa/db", codes.PermissionDenied},                   // pods on node-b only
		{td + "/ns/istio-system/sa/ztunnel", codes.OK},                    // its own
		{"spiffe://cluster.local/ns/demo/sa/web", codes.PermissionDenied}, // foreign trust domain
	} {
		rctx, rcancel := context.WithTimeout(t.Context(), 30*time.Second)
		res, err := ca.Request(rctx, cahost.RequestArgs{Token: s.ztunnelA, Identity: c.identity, Impersonate: true})
		rcancel()
		if got := cahost.Code(err); got != c.want {
			t.Errorf("%s: code %s, want %s (err: %v)", c.identity, got, c.want, err)
		} else if c.want == codes.OK && res.SPIFFEID != c.identity {
			t.Errorf("issued %s, want %s", res.SPIFFEID, c.identity)
		}
	}
	// The service account may read the issuer's keys (Kubernetes binds
	// system:service-account-issuer-discovery to every service account):
	// forged tokens are refused without a TokenReview.
	waitLogLines(t, ca, `"msg":"fetched the service account issuer's keys"`)
	if lines := logLines(ca, "cannot fetch the service account issuer's keys"); len(lines) > 0 {
		t.Errorf("the CA could not fetch the issuer's keys: %q", lines)
	}

	client := s.cp.Client()
	err = pollUntil(t, 30*time.Second, func() (bool, error) {
		l, err := client.CoordinationV1().Leases(rel.ns).Get(t.Context(), rel.lease, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", err
	})
	if err != nil {
		t.Errorf("Lease %s/%s never held: %v", rel.ns, rel.lease, err)
	}
	secretMode := caSecret != ""
	checkPublished(t, s, rel, ca, secretMode)
	t.Run("helm test's pod gets its own certificate", func(t *testing.T) { checkHelmTest(t, s, rel, ca, tests) })
	meshNS := checkRootConfigMaps(t, s, rel, ca)
	t.Run("admissionPolicy.exclusive: istiod cannot change what the CA publishes", func(t *testing.T) {
		checkExclusive(t, s, rel, meshNS)
	})
	if secretMode {
		if _, err := client.CoreV1().Secrets(rel.ns).Get(t.Context(), rel.caSecret, metav1.GetOptions{}); err != nil {
			t.Errorf("CA Secret %s/%s: %v", rel.ns, rel.caSecret, err)
		}
	}
	// istiod's serving certificate, for the names the values give.
	t.Cleanup(func() {
		_ = client.CoreV1().Secrets(rel.istiodNS).Delete(context.Background(), rel.istiodSecret, metav1.DeleteOptions{})
	})
	err = pollUntil(t, 30*time.Second, func() (bool, error) {
		sec, err := client.CoreV1().Secrets(rel.istiodNS).Get(t.Context(), rel.istiodSecret, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		certs, err := pemCerts(sec.Data["tls.crt"])
		return err == nil && len(certs) > 0 && slices.Equal(certs[0].DNSNames, []string{"istiod.istio-system.svc", "istiod-canary.istio-system.svc"}), err
	})
	if err != nil {
		t.Errorf("istiod's Secret %s/%s: %v", rel.istiodNS, rel.istiodSecret, err)
	}
	checkAdmin(t, ca, objs)

	logs := ca.Logs()
	s.checkNoToken(t, map[string]string{ca.LogPath(): logs}) // the service account's token and ztunnel's among them
	// A refusal by the apiserver names the user ("User \"system:serviceaccount:
	// ns:sa\" cannot ..."); the start-up checks say "RBAC must allow".
	user := "system:serviceaccount:" + rel.ns + ":" + rel.serviceAccount
	refused := 0
	for line := range strings.SplitSeq(logs, "\n") {
		if strings.Contains(line, user) && strings.Contains(line, " cannot ") || strings.Contains(line, "RBAC must allow") ||
			strings.Contains(line, "ValidatingAdmissionPolicy") {
			if refused++; refused <= 5 {
				t.Errorf("the CA was refused by the apiserver: %s", line)
			}
		}
	}
	if refused > 5 {
		t.Errorf("... %d refusals in all", refused)
	}
}

// checkPublished waits for the leader's bundles: one of our signer with our
// labels, and istio.io:istiod-ca:root-cert, both holding the CA's root.
func checkPublished(t *testing.T, s *suite, rel chartRelease, ca *cahost.CA, secretMode bool) {
	t.Helper()
	var roots []*x509.Certificate
	if !secretMode {
		pemBytes, err := os.ReadFile(ca.RootCertPath())
		if err != nil {
			t.Fatal(err)
		}
		roots = parsePEMCerts(t, string(pemBytes))
	}
	bundles := s.cp.Client().CertificatesV1().ClusterTrustBundles()
	holdsRoots := func(b *certificatesv1.ClusterTrustBundle) bool {
		got := parsePEMCerts(t, b.Spec.TrustBundle)
		for _, r := range roots {
			if !slices.ContainsFunc(got, r.Equal) {
				return false
			}
		}
		return len(got) > 0
	}
	var last string
	err := pollUntil(t, 30*time.Second, func() (bool, error) {
		list, err := bundles.List(t.Context(), metav1.ListOptions{
			FieldSelector: "spec.signerName=" + rel.signer,
			LabelSelector: "app.kubernetes.io/managed-by=workload-ca,workload-ca.io/trust-domain=" + rel.trustDomain,
		})
		if err != nil {
			return false, err
		}
		istio, err := bundles.Get(t.Context(), "istio.io:istiod-ca:root-cert", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			last = fmt.Sprintf("%d bundle(s) of %s, no istio.io:istiod-ca:root-cert", len(list.Items), rel.signer)
			return false, nil
		}
		if err != nil {
			return false, err
		}
		last = fmt.Sprintf("%d bundle(s) of %s; istio bundle holds roots: %v", len(list.Items), rel.signer, holdsRoots(istio))
		return len(list.Items) == 1 && holdsRoots(&list.Items[0]) && holdsRoots(istio), nil
	})
	if err != nil {
		t.Errorf("trust bundles not published as expected: %v (last: %s)", err, last)
	}
}

// createMeshNamespace creates namespace name with the label that the
// release's root ConfigMap selector (key=value) selects.
func createMeshNamespace(t *testing.T, s *suite, rel chartRelease, name string) {
	t.Helper()
	key, value, ok := strings.Cut(rel.rootConfigMapSelector, "=")
	if !ok {
		t.Fatalf("--istio-root-configmap-namespaces %q: want key=value", rel.rootConfigMapSelector)
	}
	createNamespace(t, s, name, map[string]string{key: value})
}

// checkRootConfigMaps checks that a namespace the chart's selector matches,
// created while the CA runs, gets Istio's root ConfigMap, holding the roots
// of the published bundle, and that one it does not match gets none once
// the CA has reconciled it. It returns the first namespace.
func checkRootConfigMaps(t *testing.T, s *suite, rel chartRelease, ca *cahost.CA) string {
	t.Helper()
	run := rand.String(5) // -count > 1 runs in fresh namespaces
	meshNS, outside := "wca-rbac-mesh-"+run, "wca-rbac-outside-"+run
	createMeshNamespace(t, s, rel, meshNS)
	client := s.cp.Client()
	istio, err := client.CertificatesV1().ClusterTrustBundles().Get(t.Context(), "istio.io:istiod-ca:root-cert", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roots := parsePEMCerts(t, istio.Spec.TrustBundle)
	var last string
	err = pollUntil(t, 30*time.Second, func() (bool, error) {
		cm, err := client.CoreV1().ConfigMaps(meshNS).Get(t.Context(), rootConfigMap, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			last = "no ConfigMap"
			return false, nil
		}
		if err != nil {
			return false, err
		}
		got := parsePEMCerts(t, cm.Data["root-cert.pem"])
		last = fmt.Sprintf("%d root(s), labels %v", len(got), cm.Labels)
		return slices.EqualFunc(got, roots, (*x509.Certificate).Equal) && cm.Labels["app.kubernetes.io/managed-by"] == "workload-ca", nil
	})
	if err != nil {
		t.Errorf("%s in %s: %v (last: %s)", rootConfigMap, meshNS, err, last)
	}
	// The namespace created last was published, so the CA has reconciled
	// every namespace: the next skip is the new unselected one's.
	skippedBefore, _ := s.scrape(t, ca.AdminAddr()).Sum(mRootCMs, "result", "skipped")
	createNamespace(t, s, outside, nil)
	err = pollUntil(t, 30*time.Second, func() (bool, error) {
		samples, err := scrapeCA(t.Context(), ca)
		n, _ := samples.Sum(mRootCMs, "result", "skipped")
		return n > skippedBefore, err
	})
	if err != nil {
		t.Errorf("namespace %s never reconciled (%s{result=\"skipped\"}): %v", outside, mRootCMs, err)
	}
	if _, err := client.CoreV1().ConfigMaps(outside).Get(t.Context(), rootConfigMap, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("%s in a namespace the selector does not match: %v, want NotFound", rootConfigMap, err)
	}
	return meshNS
}

// checkAdmin checks the probes' endpoints and that every workload_ca_*
// series the chart's alerts and dashboard use is exported.
func checkAdmin(t *testing.T, ca *cahost.CA, objs []*unstructured.Unstructured) {
	t.Helper()
	get := func(path string) (int, string) {
		code, body := httpGet(t, "http://"+ca.AdminAddr()+path)
		return code, string(body)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body := get(p); code != http.StatusOK {
			t.Errorf("GET %s: %d %s", p, code, body)
		}
	}
	_, exposition := get("/metrics")
	var used []string
	for _, o := range objs {
		if o.GetKind() == "PrometheusRule" || o.GetKind() == "ConfigMap" {
			used = append(used, metricNames(o)...)
		}
	}
	slices.Sort(used)
	used = slices.Compact(used)
	if len(used) < 5 {
		t.Fatalf("the chart's alerts and dashboard use only %v", used)
	}
	for _, name := range used {
		if !strings.Contains(exposition, "\n"+name+"{") && !strings.Contains(exposition, "\n"+name+" ") {
			t.Errorf("the chart uses %s, which /metrics does not export", name)
		}
	}
	if !strings.Contains(exposition, "\nworkload_ca_leader 1") {
		t.Errorf("workload_ca_leader is not 1 on the only replica:\n%s", grepLines(exposition, "workload_ca_leader", 5))
	}
	t.Logf("/metrics exports all %d series the chart uses: %s", len(used), strings.Join(used, ", "))
}

// serviceAccountKubeconfig mints a token for ns/sa (TokenRequest) and
// writes a kubeconfig that authenticates with it; it returns the path. The
// token is remembered for the log checks.
func serviceAccountKubeconfig(t *testing.T, s *suite, ns, sa string) string {
	t.Helper()
	seconds := int64(3600)
	tr, err := s.cp.Client().CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.remember(tr.Status.Token)
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: e2e
  context: {cluster: e2e, user: %s}
current-context: e2e
`, s.cp.Host(), s.cp.CAFile(), sa, tr.Status.Token, sa)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func parsePEMCerts(t *testing.T, s string) []*x509.Certificate {
	t.Helper()
	certs, err := pemCerts([]byte(s))
	if err != nil {
		t.Fatalf("bundle: %v", err)
	}
	return certs
}

// grepLines returns up to n lines of s that contain substr.
func grepLines(s, substr string, n int) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, substr) && len(out) < n {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
