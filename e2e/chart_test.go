package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/workload-ca/workload-ca/e2e/cahost"
)

// The chart, relative to this package (go test runs in e2e/).
const chartDir = "../deploy/charts/workload-ca"

// envHelm overrides the helm binary (default: bin/helm, which `make tools`
// builds from tools/go.mod).
const envHelm = "WORKLOAD_CA_HELM"

// fieldManager owns what the tests apply.
const fieldManager = "workload-ca-e2e"

// TestChart renders the chart with the default values and with every file
// in its ci/ folder, lints it, checks that every flag it renders is one the
// binary knows, and applies the manifests with a server-side dry run
// (admission included) to the real apiserver, in a namespace that enforces
// the restricted Pod Security Standard.
func TestChart(t *testing.T) {
	s := suiteFor(t)
	helm := helmBinary(t)
	kubeVersion := serverVersion(t, s)
	flags := knownServeFlags(t)
	ap := newApplier(t, s.cp.RESTConfig())

	cases := []struct {
		name, ns string
		values   []string
		check    func(t *testing.T, objs []*unstructured.Unstructured)
	}{
		{"default values", "wca-chart-default", nil, checkDefaultRender},
		{"ci/full-values.yaml", "wca-chart-full", []string{"ci/full-values.yaml"}, checkMonitoring},
		{"ci/plugin-values.yaml", "wca-chart-plugin", []string{"ci/plugin-values.yaml"}, checkPluginRender},
		{"ci/multicluster-values.yaml", "wca-chart-mc", []string{"ci/multicluster-values.yaml"}, checkMultiClusterRender},
		{"ci/remote-values.yaml", "wca-chart-remote", []string{"ci/remote-values.yaml"}, checkRemoteRender},
		{"ci/upstream-values.yaml", "wca-chart-upstream", []string{"ci/upstream-values.yaml"}, checkUpstreamRender},
		{"ci/upstream-certmanager-values.yaml", "wca-chart-upstream-cm", []string{"ci/upstream-certmanager-values.yaml"}, checkUpstreamRender},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lintChart(t, helm, kubeVersion, c.values...)
			createNamespace(t, s, c.ns, restrictedPSS)
			objs := renderChart(t, helm, "wca", c.ns, kubeVersion, c.values...)
			for _, o := range objs {
				// Only istiod's certificate Role and its binding live in
				// istiod's namespace.
				istiodRBAC := strings.HasSuffix(o.GetName(), "-istiod-cert") && (o.GetKind() == "Role" || o.GetKind() == "RoleBinding")
				if ns := o.GetNamespace(); ns != "" && ns != c.ns && (!istiodRBAC || ns != "istio-system") {
					t.Errorf("%s: namespace %q, want the release namespace %q", objName(o), ns, c.ns)
				}
			}
			if !slices.Contains(c.values, "ci/remote-values.yaml") {
				checkFlags(t, flags, deploymentArgs(t, objs))
			}
			if c.check != nil {
				c.check(t, objs)
			}
			for _, o := range objs {
				warnings, err := ap.apply(t.Context(), o, true)
				switch {
				case isMonitoringKind(o) && meta.IsNoMatchError(err):
					t.Logf("%s: skipped, the Prometheus Operator's CRDs are not installed", objName(o))
				case err != nil:
					t.Errorf("server-side dry-run apply of %s: %v", objName(o), err)
				case len(warnings) > 0:
					t.Errorf("%s: the apiserver warned: %s", objName(o), strings.Join(warnings, "; "))
				}
			}
			checkTestHooks(t, ap, renderChartTests(t, helm, "wca", c.ns, kubeVersion, c.values...))
		})
	}

	t.Run("values that cannot work fail to render, saying why", func(t *testing.T) {
		for _, c := range []struct {
			name, want string // want: empty when it must render
			args       []string
		}{
			{"no node agents", "nodeAgents must name at least one", []string{"--set-json", "nodeAgents=[]"}},
			{"an upstream without one", "exactly one of ca.upstream.vault.address and ca.upstream.certManager.issuerName",
				[]string{"--set", "ca.upstream.enabled=true"}},
			{"an upstream pinned and free to change", "ca.upstream.trustAnchors pins the anchor and ca.upstream.allowAnchorChange lets it change",
				[]string{"--set", "ca.upstream.enabled=true", "--set", "ca.upstream.vault.address=https://v", "--set", "ca.upstream.trustAnchors=x", "--set", "ca.upstream.allowAnchorChange=true"}},
			{"an upstream in plugin mode", "ca.upstream.enabled needs ca.mode=secret",
				[]string{"--set", "ca.upstream.enabled=true", "--set", "ca.mode=plugin", "--set", "ca.plugin.secretName=x", "--set", "ca.upstream.vault.address=https://v"}},
			{"a node agent that is not namespace/serviceaccount", "is not namespace/serviceaccount", []string{"--set-json", `nodeAgents=["ztunnel"]`}},
			{"a trust domain that is not one (values.schema.json)", "at '/trustDomain'", []string{"--set", "trustDomain=Bad Domain"}},
			{"a duration without a unit", "at '/defaultTTL'", []string{"--set", "defaultTTL=5"}},
			{"a duration that is no duration", "at '/ca/rotation/caTTL'", []string{"--set", "ca.rotation.caTTL=two years"}},
			{"a key type no generator makes", "at '/ca/keyType'", []string{"--set", "ca.keyType=ed25519"}},
			{"an unknown log level", "at '/logLevel'", []string{"--set", "logLevel=loud"}},
			{"an unknown token verification", "at '/tokenVerification'", []string{"--set", "tokenVerification=jwt"}},
			{"an unknown CA mode", "ca.mode must be secret or plugin", []string{"--set", "ca.mode=file"}},
			{"autoscaling with fewer replicas at most than at least", "autoscaling.minReplicas 5 is over autoscaling.maxReplicas 3",
				[]string{"--set", "autoscaling.enabled=true", "--set", "autoscaling.minReplicas=5", "--set", "autoscaling.maxReplicas=3"}},
			{"a CPU target over 100%", "at '/autoscaling/targetCPUUtilizationPercentage'", []string{"--set", "autoscaling.targetCPUUtilizationPercentage=150"}},
			{"istiod's certificate in a namespace that cannot be one", "at '/istiodCertificate/namespace'", []string{"--set", "istiodCertificate.namespace=Istio System"}},
			{"plugin mode without its Secret", "ca.plugin.secretName is required", []string{"--set", "ca.mode=plugin"}},
			{"a KMS key with a generated root", "ca.keyURI needs ca.mode plugin", []string{"--set", "ca.keyURI=awskms:key-id=k"}},
			{"extraArgs renaming the CA Secret under the admission policies", "changes an object the admission policies name",
				[]string{"--set-json", `extraArgs=["--ca-secret=other/state"]`}},
			{"extraArgs renaming the Lease under the admission policies", "changes an object the admission policies name",
				[]string{"--set-json", `extraArgs=["--leader-election-id", "other"]`}},
			{"the same without the admission policies", "", []string{"--set-json", `extraArgs=["--ca-secret=other/state"]`,
				"--set", "admissionPolicy.enabled=false"}},
			{"extraArgs that rename nothing", "", []string{"--set-json", `extraArgs=["--log-level=debug"]`}},
			{"a root ConfigMap selector the admission policies cannot express", "is not a label selector of",
				[]string{"--set-json", `istioRootConfigMap={"enabled":true,"namespaces":"tier>1"}`}},
			{"the same without the admission policies", "", []string{"--set-json", `istioRootConfigMap={"enabled":true,"namespaces":"tier>1"}`,
				"--set", "admissionPolicy.enabled=false"}},
			{"a set value that is not a label value (it would reach the policy's CEL)", "is not a label selector of",
				[]string{"--set-json", `istioRootConfigMap={"enabled":true,"namespaces":"a in (x'] || true || ['y)"}`}},
		} {
			_, stderr, err := helmCmd(t, helm, append([]string{"template", "wca", chartDir, "--kube-version", kubeVersion}, c.args...)...)
			switch {
			case c.want == "" && err != nil:
				t.Errorf("%s: %v: %s", c.name, err, stderr)
			case c.want != "" && (err == nil || !strings.Contains(string(stderr), c.want)):
				t.Errorf("%s: err %v, stderr %q; want a failure saying %q", c.name, err, stderr, c.want)
			}
		}
	})

	t.Run("bundles are published only where the API is served, unless forced", func(t *testing.T) {
		for _, c := range []struct {
			name    string
			args    []string
			publish bool
		}{
			{"auto, a cluster without ClusterTrustBundles", nil, false},
			{"auto, a cluster serving v1beta1", []string{"--api-versions", "certificates.k8s.io/v1beta1/ClusterTrustBundle"}, true},
			{"auto, a cluster serving v1", []string{"--api-versions", "certificates.k8s.io/v1/ClusterTrustBundle"}, true},
			{"forced on", []string{"--set", "trustBundle.publish=true"}, true},
			{"off where served", []string{"--set", "trustBundle.publish=false", "--api-versions", "certificates.k8s.io/v1/ClusterTrustBundle"}, false},
		} {
			// No --api-versions of the suite's server: helm template's own
			// defaults, which lack ClusterTrustBundles.
			out, stderr, err := helmCmd(t, helm, append([]string{"template", "wca", chartDir, "--kube-version", kubeVersion}, c.args...)...)
			if err != nil {
				t.Fatalf("%s: %v: %s", c.name, err, stderr)
			}
			flag := strings.Contains(string(out), "--publish-trust-bundle=true")
			rules := strings.Contains(string(out), `resources: ["clustertrustbundles"]`)
			if flag != c.publish || rules != c.publish {
				t.Errorf("%s: --publish-trust-bundle=true %v, bundle rules %v; want %v", c.name, flag, rules, c.publish)
			}
		}
	})

	t.Run("two releases side by side, autoscaled, applied for real", func(t *testing.T) {
		checkTwoReleases(t, s, helm, kubeVersion, ap)
	})

	t.Run("the no-leader alert only when the CA has leader work", func(t *testing.T) {
		for _, c := range []struct {
			name string
			args []string
			want bool
		}{
			{"a plug-in CA that publishes nothing: no leader election", []string{"--values", filepath.Join(chartDir, "ci/plugin-values.yaml")}, false},
			{"the same, signing pod certificates", []string{"--values", filepath.Join(chartDir, "ci/plugin-values.yaml"), "--set", "podCertificates.enabled=true"}, true},
			{"the CA Secret (rotation)", nil, true},
		} {
			objs := renderChartArgs(t, helm, "wca", "wca-chart-alerts", kubeVersion, append(c.args, "--set", "metrics.prometheusRule.enabled=true")...)
			b, err := json.Marshal(findObject(t, objs, "PrometheusRule").Object)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(string(b), `"alert":"WorkloadCANoLeader"`); got != c.want {
				t.Errorf("%s: WorkloadCANoLeader rendered %v, want %v", c.name, got, c.want)
			}
		}
	})
	t.Run("the exclusive root ConfigMap policy binds in the namespaces the CA publishes to", func(t *testing.T) {
		checkRootConfigMapBinding(t, helm, kubeVersion, ap)
	})
	t.Run("the CA may write the root ConfigMap only in the namespaces it publishes to", func(t *testing.T) {
		checkOwnConfigMapSelector(t, s, helm, kubeVersion, ap)
	})

	// The check above proves something only if the apiserver does warn about
	// a pod template that breaks the restricted standard.
	t.Run("a Deployment that breaks the restricted standard is warned about", func(t *testing.T) {
		const ns = "wca-chart-default"
		dep := findObject(t, renderChart(t, helm, "wca", ns, kubeVersion), "Deployment")
		unstructured.RemoveNestedField(dep.Object, "spec", "template", "spec", "securityContext")
		containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			delete(c.(map[string]any), "securityContext")
		}
		if err := unstructured.SetNestedSlice(dep.Object, containers, "spec", "template", "spec", "containers"); err != nil {
			t.Fatal(err)
		}
		warnings, err := ap.apply(t.Context(), dep, true)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "PodSecurity") }) {
			t.Errorf("no PodSecurity warning for a Deployment without securityContext (warnings: %q)", warnings)
		}
	})
}

// checkDefaultRender checks what the default values promise.
func checkDefaultRender(t *testing.T, objs []*unstructured.Unstructured) {
	const ns, fullname = "wca-chart-default", "wca-workload-ca"
	args := deploymentArgs(t, objs)
	for _, want := range []string{
		"--ca-secret=" + ns + "/" + fullname + "-ca",
		"--leader-election-namespace=" + ns,
		"--leader-election-id=" + fullname,
		"--serving-dns-names=" + fullname + "." + ns + ".svc," + fullname + "." + ns + ".svc.cluster.local",
		"--admin-addr=:15014",
		"--listen-addr=:15012",
		"--signer-name=workload-ca.io/spiffe",
		"--istio-compatible=false",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("Deployment args lack %s:\n%s", want, strings.Join(args, "\n"))
		}
	}
	dep := findObject(t, objs, "Deployment")
	if n, _, _ := unstructured.NestedInt64(dep.Object, "spec", "replicas"); n != 2 {
		t.Errorf("replicas %d, want 2", n)
	}
	pdb := findObject(t, objs, "PodDisruptionBudget")
	if n, _, _ := unstructured.NestedInt64(pdb.Object, "spec", "minAvailable"); n != 1 {
		t.Errorf("PodDisruptionBudget minAvailable %d, want 1", n)
	}
	c := container(t, dep)
	for _, probe := range []string{"livenessProbe", "readinessProbe", "startupProbe"} {
		port, _, _ := unstructured.NestedFieldNoCopy(c, probe, "httpGet", "port")
		if port != "http-metrics" {
			t.Errorf("%s on port %v, want http-metrics (15014)", probe, port)
		}
	}
	env, _, _ := unstructured.NestedSlice(c, "env")
	if !slices.ContainsFunc(env, func(e any) bool {
		path, _, _ := unstructured.NestedString(e.(map[string]any), "valueFrom", "fieldRef", "fieldPath")
		return e.(map[string]any)["name"] == "POD_NAMESPACE" && path == "metadata.namespace"
	}) {
		t.Errorf("no POD_NAMESPACE from the downward API in %v", env)
	}
	if !slices.ContainsFunc(env, func(e any) bool {
		res, _, _ := unstructured.NestedString(e.(map[string]any), "valueFrom", "resourceFieldRef", "resource")
		return e.(map[string]any)["name"] == "GOMEMLIMIT" && res == "limits.memory"
	}) {
		t.Errorf("no GOMEMLIMIT from the container's memory limit in %v", env)
	}
	for _, kind := range []string{"ServiceMonitor", "PrometheusRule", "ConfigMap"} {
		if slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind }) {
			t.Errorf("%s rendered with default values (monitoring is off by default)", kind)
		}
	}
}

// checkUpstreamRender: with ca.upstream, the CA gets --ca-upstream-config
// from a ConfigMap that names the upstream, Vault's credentials or the
// Role's CertificateRequests, and the upstream's alert.
func checkUpstreamRender(t *testing.T, objs []*unstructured.Unstructured) {
	args := deploymentArgs(t, objs)
	if !slices.Contains(args, "--ca-upstream-config=/etc/workload-ca/upstream/upstream.yaml") || !slices.ContainsFunc(args, hasPrefix("--ca-secret=")) {
		t.Errorf("upstream args: %v", args)
	}
	config := configMapData(t, objs, "-upstream", "upstream.yaml")
	role, _ := json.Marshal(findObject(t, objs, "Role").Object["rules"])
	dep, _ := json.Marshal(findObject(t, objs, "Deployment").Object)
	switch {
	case strings.Contains(config, "vault:"):
		for _, want := range []string{"address: \"https://vault.vault.svc:8200\"", "mount: \"pki_int\"", "caFile: /etc/workload-ca/upstream/tls/ca.crt",
			"role: \"workload-ca\"", "tokenFile: /var/run/secrets/workload-ca/upstream/token"} {
			if !strings.Contains(config, want) {
				t.Errorf("upstream.yaml lacks %q:\n%s", want, config)
			}
		}
		if !strings.Contains(string(dep), `"audience":"vault"`) || !strings.Contains(string(dep), `"secretName":"vault-ca"`) {
			t.Error("no projected token for Vault's audience, or no Vault CA Secret, in the pod")
		}
		if strings.Contains(string(role), "certificaterequests") {
			t.Errorf("the Role grants CertificateRequests for a Vault upstream: %s", role)
		}
		checkUpstreamAlert(t, objs)
	case strings.Contains(config, "certManager:"):
		if !strings.Contains(config, "name: \"corp-ca\"") || !strings.Contains(config, "kind: \"ClusterIssuer\"") {
			t.Errorf("upstream.yaml:\n%s", config)
		}
		// The ci values pin the anchor: the file upstream.yaml names is
		// the ConfigMap's anchors.pem, mounted beside it.
		anchors := configMapData(t, objs, "-upstream", "anchors.pem")
		if !strings.Contains(config, "trustAnchorFile: /etc/workload-ca/upstream/anchors.pem") || !strings.HasPrefix(anchors, "-----BEGIN CERTIFICATE-----\n") {
			t.Errorf("upstream.yaml pins no anchor, or anchors.pem is not PEM:\n%s\n%s", config, anchors)
		}
		if !strings.Contains(string(role), "certificaterequests") {
			t.Errorf("the Role does not grant CertificateRequests: %s", role)
		}
	default:
		t.Errorf("upstream.yaml names no upstream:\n%s", config)
	}
}

// configMapData returns key of the rendered ConfigMap whose name ends
// with suffix, failing t when there is none.
func configMapData(t *testing.T, objs []*unstructured.Unstructured, suffix, key string) string {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), suffix) {
			v, _, _ := unstructured.NestedString(o.Object, "data", key)
			return v
		}
	}
	t.Fatalf("no ConfigMap *%s rendered", suffix)
	return ""
}

// checkPluginRender: the plug-in CA is mounted read-only as --ca-dir, and
// nothing that mode does not need is granted.
func checkPluginRender(t *testing.T, objs []*unstructured.Unstructured) {
	args := deploymentArgs(t, objs)
	if !slices.Contains(args, "--ca-dir=/var/run/workload-ca/cacerts") || slices.ContainsFunc(args, hasPrefix("--ca-secret")) {
		t.Errorf("plugin mode args: %v", args)
	}
	if !slices.Contains(args, "--ca-key-uri=awskms:key-id=0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d;region=eu-west-1") {
		t.Errorf("ca.keyURI is not rendered as --ca-key-uri: %v", args)
	}
	dep := findObject(t, objs, "Deployment")
	vols, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "volumes")
	if !slices.ContainsFunc(vols, func(v any) bool {
		name, _, _ := unstructured.NestedString(v.(map[string]any), "secret", "secretName")
		return name == "cacerts"
	}) {
		t.Errorf("Secret cacerts is not mounted: %v", vols)
	}
	if slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == "PodDisruptionBudget" }) {
		t.Error("PodDisruptionBudget rendered for one replica: it would block every drain")
	}
	rules := func(kind string) string {
		b, _ := json.Marshal(findObject(t, objs, kind).Object["rules"])
		return string(b)
	}
	if r := rules("Role"); strings.Contains(r, "secrets") {
		t.Errorf("plugin mode Role grants secrets: %s", r)
	}
	if r := rules("ClusterRole"); strings.Contains(r, "certificates.k8s.io") {
		t.Errorf("ClusterRole grants certificates.k8s.io with trustBundle.publish=false: %s", r)
	}
}

// helmBinary returns bin/helm (or $WORKLOAD_CA_HELM).
func helmBinary(t *testing.T) string {
	return toolBinary(t, "helm", envHelm)
}

// toolBinary returns bin/<name>, or the path in the environment variable
// env; without it the test fails, since `make e2e` builds it.
func toolBinary(t *testing.T, name, env string) string {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		var err error
		if path, err = filepath.Abs(filepath.Join("..", "bin", name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s is missing (%v): `make e2e` builds bin/%s from pinned modules, or set %s", name, err, name, env)
	}
	return path
}

// runHelm runs helm (see helmCmd) and fails the test if helm fails.
func runHelm(t *testing.T, helm string, args ...string) []byte {
	t.Helper()
	stdout, stderr, err := helmCmd(t, helm, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout, stderr)
	}
	return stdout
}

// helmCmd runs helm with its cache, config and data homes in a temporary
// directory, so nothing outside the test is read or written.
func helmCmd(t *testing.T, helm string, args ...string) (stdout, stderr []byte, err error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.CommandContext(t.Context(), helm, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "no-kubeconfig"))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.Bytes(), errOut.Bytes(), err
}

func valuesArgs(values []string) []string {
	var args []string
	for _, v := range values {
		args = append(args, "--values", filepath.Join(chartDir, v))
	}
	return args
}

func lintChart(t *testing.T, helm, kubeVersion string, values ...string) {
	t.Helper()
	runHelm(t, helm, append([]string{"lint", chartDir, "--strict", "--kube-version", kubeVersion}, valuesArgs(values)...)...)
}

// renderChart runs helm template and decodes every manifest.
func renderChart(t *testing.T, helm, release, ns, kubeVersion string, values ...string) []*unstructured.Unstructured {
	t.Helper()
	return renderChartArgs(t, helm, release, ns, kubeVersion, valuesArgs(values)...)
}

// renderChartArgs is renderChart with helm template's own arguments.
// The chart sees the suite's API server as helm install would: its
// version and every kind it serves (.Capabilities).
// Hooks (helm test's objects) are left out: helm install does not apply
// them; renderChartTests returns them.
func renderChartArgs(t *testing.T, helm, release, ns, kubeVersion string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	objs, _ := renderAll(t, helm, release, ns, kubeVersion, args...)
	return objs
}

// renderChartTests returns the objects helm test creates.
func renderChartTests(t *testing.T, helm, release, ns, kubeVersion string, values ...string) []*unstructured.Unstructured {
	t.Helper()
	_, tests := renderAll(t, helm, release, ns, kubeVersion, valuesArgs(values)...)
	return tests
}

func renderAll(t *testing.T, helm, release, ns, kubeVersion string, args ...string) (objs, tests []*unstructured.Unstructured) {
	t.Helper()
	out := runHelm(t, helm, append(append([]string{"template", release, chartDir,
		"--namespace", ns, "--kube-version", kubeVersion}, apiVersionArgs(t)...), args...)...)
	for _, o := range decodeManifests(t, out) {
		switch hook := o.GetAnnotations()["helm.sh/hook"]; hook {
		case "":
			objs = append(objs, o)
		case "test":
			tests = append(tests, o)
		default:
			t.Fatalf("%s: hook %q; the chart has test hooks only", objName(o), hook)
		}
	}
	return objs, tests
}

// apiVersionArgs lists every group/version/Kind the suite's API server
// serves as helm template --api-versions flags.
func apiVersionArgs(t *testing.T) []string {
	t.Helper()
	_, lists, err := suiteFor(t).cp.Client().Discovery().ServerGroupsAndResources()
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	var args []string
	for _, l := range lists {
		for _, r := range l.APIResources {
			if !strings.Contains(r.Name, "/") {
				args = append(args, "--api-versions", l.GroupVersion+"/"+r.Kind)
			}
		}
	}
	return args
}

// decodeManifests decodes every manifest helm template printed.
func decodeManifests(t *testing.T, out []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	var objs []*unstructured.Unstructured
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decoding helm template output: %v", err)
		}
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		o := &unstructured.Unstructured{}
		if err := o.UnmarshalJSON(raw); err != nil {
			t.Fatalf("manifest %s: %v", raw, err)
		}
		objs = append(objs, o)
	}
	if len(objs) == 0 {
		t.Fatal("helm template rendered nothing")
	}
	return objs
}

func serverVersion(t *testing.T, s *suite) string {
	t.Helper()
	v, err := s.cp.Client().Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	return v.GitVersion
}

// restrictedPSS makes the namespace enforce, and warn about, the restricted
// Pod Security Standard.
var restrictedPSS = map[string]string{
	"pod-security.kubernetes.io/enforce": "restricted",
	"pod-security.kubernetes.io/warn":    "restricted",
}

// createNamespace creates ns for real (it may exist from an earlier subtest).
func createNamespace(t *testing.T, s *suite, name string, labels map[string]string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	_, err := s.cp.Client().CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// applier applies unstructured objects with server-side apply, mapping
// kinds to resources through discovery.
type applier struct {
	dyn      dynamic.Interface
	mapper   meta.RESTMapper
	mu       sync.Mutex
	warnings []string
}

func newApplier(t *testing.T, cfg *rest.Config) *applier {
	t.Helper()
	a := &applier{}
	cfg.WarningHandler = a
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	if a.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return a
}

// HandleWarningHeader collects the apiserver's warnings (rest.WarningHandler).
func (a *applier) HandleWarningHeader(_ int, _, text string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.warnings = append(a.warnings, text)
}

// apply server-side applies o (as a dry run when dryRun) and returns the
// warnings the apiserver sent with the response. Calls must not overlap.
func (a *applier) apply(ctx context.Context, o *unstructured.Unstructured, dryRun bool) ([]string, error) {
	ri, err := a.resource(o)
	if err != nil {
		return nil, err
	}
	opts := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	a.mu.Lock()
	a.warnings = nil
	a.mu.Unlock()
	_, err = ri.Apply(ctx, o.GetName(), o, opts)
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.warnings, err
}

// delete deletes o, ignoring NotFound.
func (a *applier) delete(ctx context.Context, o *unstructured.Unstructured) error {
	ri, err := a.resource(o)
	if err != nil {
		return err
	}
	if err := ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// resource returns the client for o's resource, in o's namespace if it
// is namespaced.
func (a *applier) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	m, err := a.mapper.RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
	if err != nil {
		return nil, err
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return a.dyn.Resource(m.Resource).Namespace(o.GetNamespace()), nil
	}
	return a.dyn.Resource(m.Resource), nil
}

func isMonitoringKind(o *unstructured.Unstructured) bool {
	return o.GroupVersionKind().Group == "monitoring.coreos.com"
}

func objName(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetKind() + " " + o.GetName()
	}
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// findObject returns the only object of kind.
func findObject(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s rendered, want 1", len(found), kind)
	}
	return found[0]
}

// findIn returns the one object of kind in namespace ns.
func findIn(t *testing.T, objs []*unstructured.Unstructured, kind, ns string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && o.GetNamespace() == ns {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s rendered in namespace %q, want 1", len(found), kind, ns)
	}
	return found[0]
}

func container(t *testing.T, dep *unstructured.Unstructured) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("%d containers, want 1", len(cs))
	}
	return cs[0].(map[string]any)
}

// deploymentArgs returns the container's args without the subcommand.
func deploymentArgs(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	args, _, err := unstructured.NestedStringSlice(container(t, findObject(t, objs, "Deployment")), "args")
	if err != nil || len(args) == 0 || args[0] != "serve" {
		t.Fatalf("container args %v (%v): want serve and flags", args, err)
	}
	return args[1:]
}

func hasPrefix(p string) func(string) bool {
	return func(s string) bool { return strings.HasPrefix(s, p) }
}

// flagName returns the name of a --name=value argument.
func flagName(arg string) (string, bool) {
	if !strings.HasPrefix(arg, "--") {
		return "", false
	}
	name, _, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
	return name, true
}

// checkMultiClusterRender: the CA watches its namespace's remote Secrets,
// and may list them there, nowhere else.
func checkMultiClusterRender(t *testing.T, objs []*unstructured.Unstructured) {
	args := deploymentArgs(t, objs)
	for _, want := range []string{"--cluster-id=east", "--remote-cluster-secrets", "--remote-cluster-secrets-namespace=wca-chart-mc"} {
		if !slices.Contains(args, want) {
			t.Errorf("the Deployment lacks %s: %q", want, args)
		}
	}
	var role rbacv1.Role
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(findIn(t, objs, "Role", "wca-chart-mc").Object, &role); err != nil {
		t.Fatal(err)
	}
	want := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list", "watch"}}
	if !slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return cmp.Equal(r, want) }) {
		t.Errorf("the Role has no %v: %v", want, role.Rules)
	}
}

// checkRemoteRender: remote mode renders what a remote cluster grants a
// CA elsewhere, and nothing of the CA.
func checkRemoteRender(t *testing.T, objs []*unstructured.Unstructured) {
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind())
	}
	slices.Sort(kinds)
	if want := []string{"ClusterRole", "ClusterRoleBinding", "Secret", "ServiceAccount"}; !slices.Equal(kinds, want) {
		t.Errorf("remote mode renders %q, want %q", kinds, want)
	}
	var cr rbacv1.ClusterRole
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(findObject(t, objs, "ClusterRole").Object, &cr); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(remoteClusterRules, cr.Rules); d != "" {
		t.Errorf("remote ClusterRole rules (-want +got):\n%s", d)
	}
}

// checkTestHooks applies helm test's service account and dry-runs its
// pod (the pod needs the account to exist), in the restricted namespace:
// the pod must be admitted as it is rendered.
func checkTestHooks(t *testing.T, ap *applier, tests []*unstructured.Unstructured) {
	t.Helper()
	if len(tests) == 0 {
		t.Log("helm test not rendered: these values publish the roots neither as ClusterTrustBundles nor as Istio's ConfigMap")
		return
	}
	if len(tests) != 2 || tests[0].GetKind() != "ServiceAccount" || tests[1].GetKind() != "Pod" {
		t.Fatalf("helm test renders %d objects, want its ServiceAccount and Pod", len(tests))
	}
	for i, o := range tests {
		warnings, err := ap.apply(t.Context(), o, i == 1)
		if err != nil {
			t.Errorf("apply %s (dry run: %v): %v", objName(o), i == 1, err)
		} else if len(warnings) > 0 {
			t.Errorf("%s: the apiserver warned: %s", objName(o), strings.Join(warnings, "; "))
		}
	}
}

// knownServeFlags lists the flags of `workload-ca serve` from its -h output.
func knownServeFlags(t *testing.T) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, os.Getenv(cahost.EnvBinary), "serve", "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-[a-z], )?--([a-z0-9][a-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if !flags["trust-domain"] {
		t.Fatalf("cannot read the flags of `workload-ca serve -h`:\n%s", out)
	}
	return flags
}

// checkFlags fails on a rendered flag the binary does not know.
func checkFlags(t *testing.T, known map[string]bool, args []string) {
	t.Helper()
	for _, a := range args {
		name, ok := flagName(a)
		switch {
		case !ok:
			t.Errorf("argument %q is not --flag=value", a)
		case !known[name]:
			t.Errorf("the chart renders --%s, which `workload-ca serve` does not know", name)
		}
	}
}

// checkRootConfigMapBinding renders the chart with admissionPolicy.exclusive
// and root ConfigMap selectors of every form the CA reads, and checks that
// the binding of the root ConfigMap policy selects exactly the namespaces
// the CA's own reading of the selector does (over label sets drawn from
// the selectors' keys and values), and that the apiserver accepts it.
func checkRootConfigMapBinding(t *testing.T, helm, kubeVersion string, ap *applier) {
	for _, sel := range []string{
		"istio.io/dataplane-mode=ambient",
		"a==b",
		"a!=b",
		"a in (b, x),c notin (y)",
		"a, !c",
		"a=b, c in (x,y),!d,e,f!=g,h==",
	} {
		t.Run(sel, func(t *testing.T) {
			var binding *unstructured.Unstructured
			for _, o := range renderWithRootSelector(t, helm, kubeVersion, "wca", "default", sel, "--set", "admissionPolicy.exclusive=true") {
				if o.GetKind() == "ValidatingAdmissionPolicyBinding" && strings.HasSuffix(o.GetName(), "-root-configmaps") {
					binding = o
				}
			}
			if binding == nil {
				t.Fatal("no binding of the root ConfigMap policy rendered")
			}
			raw, found, err := unstructured.NestedMap(binding.Object, "spec", "matchResources", "namespaceSelector")
			if err != nil || !found {
				t.Fatalf("the binding has no namespaceSelector (%v)", err)
			}
			var ls metav1.LabelSelector
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &ls); err != nil {
				t.Fatal(err)
			}
			got, err := metav1.LabelSelectorAsSelector(&ls)
			if err != nil {
				t.Fatalf("namespaceSelector %v: %v", raw, err)
			}
			want, err := labels.Parse(sel)
			if err != nil {
				t.Fatal(err)
			}
			if differs := selectorsDiffer(want, got); differs != nil {
				t.Errorf("for namespace labels %v the CA's selector says %v and the binding's %v (binding: %s)",
					differs, want.Matches(differs), got.Matches(differs), got)
			}
			if _, err := ap.apply(t.Context(), binding, true); err != nil {
				t.Errorf("server-side dry-run apply of %s: %v", objName(binding), err)
			}
		})
	}
}

// renderWithRootSelector renders release in ns with istioRootConfigMap on
// for the namespaces selector sel, and the values in args.
func renderWithRootSelector(t *testing.T, helm, kubeVersion, release, ns, sel string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	values, err := json.Marshal(map[string]any{"enabled": true, "namespaces": sel})
	if err != nil {
		t.Fatal(err)
	}
	return renderChartArgs(t, helm, release, ns, kubeVersion, append([]string{"--set-json", "istioRootConfigMap=" + string(values)}, args...)...)
}

// selectorsDiffer returns a label set that one of a and b matches and the
// other does not, among label sets made of the keys and values they name;
// nil if none.
func selectorsDiffer(a, b labels.Selector) labels.Set {
	var keys []string
	vals := []string{"", "other"}
	for _, sel := range []labels.Selector{a, b} {
		reqs, _ := sel.Requirements()
		for _, r := range reqs {
			keys = append(keys, r.Key())
			vals = append(vals, r.ValuesUnsorted()...)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	slices.Sort(vals)
	vals = slices.Compact(vals)
	// Each key is absent or holds one of vals: every combination.
	choices := len(vals) + 1
	total := 1
	for range keys {
		total *= choices
	}
	for n := range total {
		set, m := labels.Set{}, n
		for _, k := range keys {
			if c := m % choices; c < len(vals) {
				set[k] = vals[c]
			}
			m /= choices
		}
		if a.Matches(set) != b.Matches(set) {
			return set
		}
	}
	return nil
}

// checkTwoReleases renders two releases in two namespaces with
// autoscaling, a NetworkPolicy, commonLabels and extraObjects, each with
// a signer and istiod certificate of its own (a signer name is what two
// CAs in one cluster must not share: each would take the other's bundles
// for stale ones). No object of one has the name of one of the other; both
// are applied to the API server (not a dry run), and each object read back
// still belongs to its release.
func checkTwoReleases(t *testing.T, s *suite, helm, kubeVersion string, ap *applier) {
	type release struct{ name, ns string }
	releases := []release{{"wca-a", "wca-two-a"}, {"wca-b", "wca-two-b"}}
	owner := map[string]string{} // kind/namespace/name → release
	var applied []*unstructured.Unstructured
	t.Cleanup(func() {
		for _, o := range slices.Backward(applied) {
			if err := ap.delete(context.Background(), o); err != nil {
				t.Errorf("delete %s: %v", objName(o), err)
			}
		}
	})
	for _, r := range releases {
		createNamespace(t, s, r.ns, restrictedPSS)
		objs := renderChartArgs(t, helm, r.name, r.ns, kubeVersion,
			"--set", "trustBundle.signerName="+r.name+".example.org/spiffe",
			"--set", "istiodCertificate.enabled=true", "--set", "istiodCertificate.secretName="+r.name+"-istiod-tls",
			"--set", "autoscaling.enabled=true", "--set", "autoscaling.minReplicas=3",
			"--set", "networkPolicy.enabled=true",
			"--set-json", `networkPolicy.admin.from=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]`,
			"--set-json", `commonLabels={"example.org/team":"mesh"}`,
			"--set-json", `extraObjects=[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{{ .Release.Name }}-extra","namespace":"{{ .Release.Namespace }}"}}]`)
		kinds := map[string]int{}
		for _, o := range objs {
			kinds[o.GetKind()]++
			key := o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
			if other, ok := owner[key]; ok {
				t.Errorf("%s: rendered by release %s and %s", key, other, r.name)
			}
			owner[key] = r.name
			if o.GetKind() != "ConfigMap" && o.GetLabels()["example.org/team"] != "mesh" {
				t.Errorf("%s of %s: no commonLabels", objName(o), r.name)
			}
		}
		for _, k := range []string{"HorizontalPodAutoscaler", "NetworkPolicy", "ConfigMap", "PodDisruptionBudget"} {
			if kinds[k] != 1 {
				t.Errorf("%s renders %d %s, want 1", r.name, kinds[k], k)
			}
		}
		dep := findObject(t, objs, "Deployment")
		if _, ok, _ := unstructured.NestedInt64(dep.Object, "spec", "replicas"); ok {
			t.Errorf("%s: the Deployment sets replicas under autoscaling", r.name)
		}
		for _, o := range objs {
			if isMonitoringKind(o) {
				continue
			}
			if _, err := ap.apply(t.Context(), o, false); err != nil {
				t.Fatalf("apply %s of %s: %v", objName(o), r.name, err)
			}
			applied = append(applied, o)
		}
	}
	for _, o := range applied {
		ri, err := ap.resource(o)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ri.Get(t.Context(), o.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("read back %s: %v", objName(o), err)
		}
		if want := owner[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()]; o.GetKind() != "ConfigMap" && got.GetLabels()["app.kubernetes.io/instance"] != want {
			t.Errorf("%s belongs to %q, want %q", objName(o), got.GetLabels()["app.kubernetes.io/instance"], want)
		}
	}
}
