package e2e_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.step.sm/crypto/pemutil"
	"google.golang.org/grpc/codes"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/policy"
	"github.com/workload-ca/workload-ca/policy/watch"
)

const mPolicyDecisions = "workload_ca_policy_decisions_total"

// TestIssuancePolicies runs two replicas with --issuance-policies and
// --pod-certificates against five IssuancePolicies, and observes each
// through both front doors: a node agent's request over gRPC (`workload-ca
// request`) and a PodCertificateRequest. Each decision shows in the
// answer (code and message, or condition), the audit record, the metric
// and the policy's status.
func TestIssuancePolicies(t *testing.T) {
	f := newLCFixture(t, "policy")
	s := f.s
	ensurePolicyCRD(t, s)
	w := newPolicyWorld(t, f)
	policies := w.policies()
	for _, p := range policies {
		w.create(t, p)
	}
	cas := f.startN(t, 2, "--pod-certificates", "--issuance-policies", "--issuance-policy-status-interval=1s")
	// The leader signs pod certificates; both replicas answer gRPC.
	leader := theLeader(t, cas)
	ca, follower := cas[leader], cas[1-leader]
	name := func(short string) string { return w.run + "-" + short }

	t.Run("(a) a namespace's lifetime is capped", func(t *testing.T) {
		res, err := w.ask(t, ca, w.ztA, w.payments, "web")
		if err != nil {
			t.Fatal(err)
		}
		if life := res.NotAfter.Sub(res.NotBefore); life > 95*time.Minute {
			t.Errorf("gRPC: lifetime %v for a 24h request; the policy caps it at 90m", life)
		}
		pcr := w.podCert(t, "web-0", w.payments, "web", w.nodeA)
		if c := conditionOf(pcr); c.Type != certv1.PodCertificateRequestConditionTypeIssued {
			t.Fatalf("podcert: %s %s: %s; want Issued", c.Type, c.Reason, c.Message)
		}
		chain, err := pemutil.ParseCertificateBundle([]byte(pcr.Status.CertificateChain))
		if err != nil {
			t.Fatal(err)
		}
		if life := chain[0].NotAfter.Sub(chain[0].NotBefore); life > 95*time.Minute {
			t.Errorf("podcert: lifetime %v for a 24h request; the policy caps it at 90m", life)
		}
		for _, door := range []string{"grpc", "podcert"} {
			waitLogLines(t, ca, `"msg":"certificate issued"`, `"door":"`+door+`"`, `"policy":"`+name("cap")+`"`)
		}
		w.waitDecisions(t, ca, name("cap"), "ttl-capped", func(d policy.Decisions) bool { return d.TTLCapped >= 2 })
	})

	t.Run("(b) the default service account is denied", func(t *testing.T) {
		for _, replica := range []*cahost.CA{ca, follower} {
			_, err := w.ask(t, replica, w.ztA, w.payments, "default")
			wantRefused(t, err, codes.PermissionDenied, `denied by issuance policy "`+name("no-default")+`": the default service account gets no identity`)
		}
		pcr := w.podCert(t, "default-0", w.payments, "default", w.nodeA)
		if c := conditionOf(pcr); c.Type != certv1.PodCertificateRequestConditionTypeDenied || !strings.Contains(c.Message, name("no-default")) {
			t.Errorf("podcert: %s %s: %s; want Denied by %s", c.Type, c.Reason, c.Message, name("no-default"))
		}
		for _, door := range []string{"grpc", "podcert"} {
			waitLogLines(t, ca, `"msg":"certificate request refused"`, `"door":"`+door+`"`, `"reason":"policy-denied"`, `"policy":"`+name("no-default")+`"`)
		}
		// Each replica adds its own decisions to the status: two
		// gRPC denials (one per replica) and the pod certificate's.
		w.waitDecisions(t, ca, name("no-default"), "denied", func(d policy.Decisions) bool { return d.Denied == 3 })
	})

	t.Run("(c) a tenant's namespace is served only on its own nodes", func(t *testing.T) {
		if _, err := w.ask(t, ca, w.ztA, w.tenant, "api"); err != nil {
			t.Errorf("gRPC: the agent on the tenant's node: %v", err)
		}
		_, err := w.ask(t, ca, w.ztB, w.tenant, "api")
		wantRefused(t, err, codes.PermissionDenied, name("tenant"))
		if c := conditionOf(w.podCert(t, "api-a", w.tenant, "api", w.nodeA)); c.Type != certv1.PodCertificateRequestConditionTypeIssued {
			t.Errorf("podcert on the tenant's node: %s %s: %s; want Issued", c.Type, c.Reason, c.Message)
		}
		if c := conditionOf(w.podCert(t, "api-b", w.tenant, "api", w.nodeB)); c.Type != certv1.PodCertificateRequestConditionTypeDenied || !strings.Contains(c.Message, name("tenant")) {
			t.Errorf("podcert on another node: %s %s: %s; want Denied by %s", c.Type, c.Reason, c.Message, name("tenant"))
		}
		for _, door := range []string{"grpc", "podcert"} {
			waitLogLines(t, ca, `"door":"`+door+`"`, `"reason":"policy-denied"`, `"policy":"`+name("tenant")+`"`)
		}
		w.waitDecisions(t, ca, name("tenant"), "denied", func(d policy.Decisions) bool { return d.Denied >= 2 && d.Selected >= 4 })
	})

	t.Run("(d) a dry-run policy records and refuses nothing", func(t *testing.T) {
		// (a)'s requests for web, which this policy would refuse, were issued.
		for _, door := range []string{"grpc", "podcert"} {
			waitLogLines(t, ca, `"msg":"certificate issued"`, `"door":"`+door+`"`, `"policy_dry_run_denied":"`+name("dry")+`"`)
		}
		w.waitDecisions(t, ca, name("dry"), "would-deny", func(d policy.Decisions) bool { return d.WouldDeny >= 2 && d.Denied == 0 })
		if c := w.compiled(t, name("dry")); c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "dry-run") {
			t.Errorf("Compiled condition %s: %s", c.Status, c.Message)
		}
	})

	t.Run("(e) a policy that does not compile refuses what it selects, until fixed", func(t *testing.T) {
		if c := w.compiled(t, name("broken")); c.Status != metav1.ConditionFalse || c.Reason != "CompileError" {
			t.Errorf("Compiled condition %s %s: %s; want False CompileError", c.Status, c.Reason, c.Message)
		}
		_, err := w.ask(t, ca, w.ztA, w.payments, "broken")
		wantRefused(t, err, codes.Unavailable, `issuance policy "`+name("broken")+`" cannot decide`)
		pcrName := w.createPodCert(t, "broken-0", w.payments, "broken", w.nodeA)
		for _, door := range []string{"grpc", "podcert"} {
			waitLogLines(t, ca, `"door":"`+door+`"`, `"reason":"policy-unavailable"`, `"policy":"`+name("broken")+`"`)
		}
		if pcr := w.getPodCert(t, w.payments, pcrName); len(pcr.Status.Conditions) != 0 {
			t.Errorf("podcert: %v; want the request pending, retried", pcr.Status.Conditions)
		}
		w.waitDecisions(t, ca, name("broken"), "unavailable", func(d policy.Decisions) bool { return d.Unavailable >= 2 })

		// Fixed, the policy compiles and the pending request is issued.
		p := w.get(t, name("broken"))
		p.Spec.Validations = []policy.Validation{{Expression: "identityServiceAccount == 'broken'"}}
		w.update(t, p)
		err = pollUntil(t, lcWait, func() (bool, error) {
			c := w.compiled(t, name("broken"))
			return c.Status == metav1.ConditionTrue && c.ObservedGeneration == p.Generation+1, nil
		})
		if err != nil {
			t.Fatalf("the fixed policy's Compiled condition: %v", err)
		}
		if _, err := w.ask(t, ca, w.ztA, w.payments, "broken"); err != nil {
			t.Errorf("gRPC after the fix: %v", err)
		}
		err = pollUntil(t, 2*time.Minute, func() (bool, error) {
			return len(w.getPodCert(t, w.payments, pcrName).Status.Conditions) > 0, nil
		})
		if c := conditionOf(w.getPodCert(t, w.payments, pcrName)); err != nil || c.Type != certv1.PodCertificateRequestConditionTypeIssued {
			t.Errorf("podcert after the fix: %s %s: %s (%v); want Issued", c.Type, c.Reason, c.Message, err)
		}
	})
}

// policyWorld is TestIssuancePolicies' cluster: two namespaces (payments,
// labelled team; tenant, labelled tenant), two nodes (one in the tenant's
// pool), a ztunnel on each, and the pods the requests are for.
type policyWorld struct {
	f                *lcFixture
	run              string
	payments, tenant string
	nodeA, nodeB     string
	ztA, ztB         string
	pods             map[string]*corev1.Pod
	accounts         map[string]*corev1.ServiceAccount
	client           dynamic.ResourceInterface
	key              *ecdsa.PrivateKey
}

func newPolicyWorld(t *testing.T, f *lcFixture) *policyWorld {
	t.Helper()
	s := f.s
	w := &policyWorld{f: f, run: f.name, payments: f.ns, tenant: f.ns + "-tenant", nodeA: f.name + "-a", nodeB: f.name + "-b",
		pods: map[string]*corev1.Pod{}, accounts: map[string]*corev1.ServiceAccount{}}
	ctx := t.Context()
	nss := s.cp.Client().CoreV1().Namespaces()
	patch := fmt.Sprintf(`{"metadata":{"labels":{"policy-e2e":%q,"team":%q}}}`, w.run, w.run+"-payments")
	if _, err := nss.Patch(ctx, w.payments, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	createNamespace(t, s, w.tenant, map[string]string{"policy-e2e": w.run, "tenant": w.run})
	for _, n := range []struct {
		name   string
		labels map[string]string
	}{{w.nodeA, map[string]string{"pool": w.run}}, {w.nodeB, nil}} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: n.labels}}
		if _, err := s.cp.Client().CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = s.cp.Client().CoreV1().Nodes().Delete(context.Background(), n.name, metav1.DeleteOptions{})
		})
	}
	for _, p := range [][4]string{
		{w.payments, "web-0", "web", w.nodeA}, {w.payments, "default-0", "default", w.nodeA}, {w.payments, "broken-0", "broken", w.nodeA},
		{w.tenant, "api-a", "api", w.nodeA}, {w.tenant, "api-b", "api", w.nodeB},
	} {
		w.account(t, p[0], p[2])
		w.pods[p[0]+"/"+p[1]] = s.createPod(t, p[0], p[1], p[2], p[3])
	}
	for i, node := range []string{w.nodeA, w.nodeB} {
		pod := s.createPod(t, "istio-system", "ztunnel-"+node, "ztunnel", node)
		t.Cleanup(func() {
			_ = s.cp.Client().CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		})
		tok, err := s.mintFor(ctx, pod, audience, 3600)
		if err != nil {
			t.Fatal(err)
		}
		*[]*string{&w.ztA, &w.ztB}[i] = tok
	}
	dyn, err := dynamic.NewForConfig(s.cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	w.client = dyn.Resource(watch.GVR)
	if w.key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *policyWorld) account(t *testing.T, ns, name string) {
	t.Helper()
	if _, ok := w.accounts[ns+"/"+name]; ok {
		return
	}
	sa, err := w.f.s.cp.CreateServiceAccount(t.Context(), ns, name)
	if apierrors.IsAlreadyExists(err) {
		sa, err = w.f.s.cp.Client().CoreV1().ServiceAccounts(ns).Get(t.Context(), name, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	w.accounts[ns+"/"+name] = sa
}

// policies are the five policies of the test, named after the run.
func (w *policyWorld) policies() []*policy.IssuancePolicy {
	p := func(short string, spec policy.Spec) *policy.IssuancePolicy {
		return &policy.IssuancePolicy{TypeMeta: metav1.TypeMeta{APIVersion: policy.Group + "/" + policy.Version, Kind: policy.Kind},
			ObjectMeta: metav1.ObjectMeta{Name: w.run + "-" + short}, Spec: spec}
	}
	sel := func(k, v string) policy.Match {
		return policy.Match{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}}
	}
	return []*policy.IssuancePolicy{
		p("cap", policy.Spec{Match: sel("team", w.run+"-payments"), MaxTTL: "duration('90m')"}),
		p("no-default", policy.Spec{Match: sel("policy-e2e", w.run),
			Validations: []policy.Validation{{Expression: "identityServiceAccount != 'default'", Message: "the default service account gets no identity"}}}),
		p("tenant", policy.Spec{Match: sel("tenant", w.run), Validations: []policy.Validation{{
			Expression: fmt.Sprintf("callerKind != 'workload' && nodeLabels[?'pool'].orValue('') == '%s'", w.run),
			Message:    "the tenant's namespace is served on its own nodes"}}}),
		p("dry", policy.Spec{DryRun: true, Match: sel("policy-e2e", w.run),
			Validations: []policy.Validation{{Expression: "identityServiceAccount != 'web'", Message: "web would be refused"}}}),
		p("broken", policy.Spec{Match: policy.Match{Identities: []string{id(w.payments, "broken")}},
			Validations: []policy.Validation{{Expression: "identityServiceAccount ==="}}}),
	}
}

func (w *policyWorld) create(t *testing.T, p *policy.IssuancePolicy) { createPolicy(t, w.f.s, p) }

// createPolicy creates p, and deletes it when t ends.
func createPolicy(t *testing.T, s *suite, p *policy.IssuancePolicy) {
	t.Helper()
	p.APIVersion, p.Kind = policy.Group+"/"+policy.Version, policy.Kind
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(s.cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	client := dyn.Resource(watch.GVR)
	if _, err := client.Create(t.Context(), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Delete(context.Background(), p.Name, metav1.DeleteOptions{}) })
}

func (w *policyWorld) get(t *testing.T, name string) *policy.IssuancePolicy {
	t.Helper()
	u, err := w.client.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := &policy.IssuancePolicy{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func (w *policyWorld) update(t *testing.T, p *policy.IssuancePolicy) {
	t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.client.Update(t.Context(), &unstructured.Unstructured{Object: obj}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// compiled is a policy's Compiled condition, once it has one.
func (w *policyWorld) compiled(t *testing.T, name string) metav1.Condition {
	t.Helper()
	var c metav1.Condition
	err := pollUntil(t, lcWait, func() (bool, error) {
		for _, x := range w.get(t, name).Status.Conditions {
			if x.Type == policy.ConditionCompiled {
				c = x
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("policy %s has no Compiled condition: %v", name, err)
	}
	return c
}

// waitDecisions waits until the policy's status counts what ok wants,
// and checks the metric counts decision too.
func (w *policyWorld) waitDecisions(t *testing.T, ca *cahost.CA, name, decision string, ok func(policy.Decisions) bool) {
	t.Helper()
	var d policy.Decisions
	if err := pollUntil(t, lcWait, func() (bool, error) { d = w.get(t, name).Status.Decisions; return ok(d), nil }); err != nil {
		t.Errorf("policy %s's status counts %+v: %v", name, d, err)
	}
	samples, err := scrapeCA(t.Context(), ca)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := samples.Sum(mPolicyDecisions, "policy", name, "decision", decision); n < 1 {
		t.Errorf("%s{policy=%q,decision=%q} = %v, want at least 1", mPolicyDecisions, name, decision, n)
	}
}

// ask asks for ns/sa as a node agent, for 24h.
func (w *policyWorld) ask(t *testing.T, ca *cahost.CA, token, ns, sa string) (cahost.Result, error) {
	t.Helper()
	return ca.Request(t.Context(), cahost.RequestArgs{Token: token, Identity: id(ns, sa), Impersonate: true, TTL: 24 * time.Hour})
}

func wantRefused(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	var refused *cahost.RefusedError
	if !errors.As(err, &refused) || refused.Code != code || !strings.Contains(refused.Message, msg) {
		t.Errorf("gRPC: %v; want %s saying %q", err, code, msg)
	}
}

// createPodCert creates a PodCertificateRequest as the kubelet of node
// does for pod ns/name, and returns its name.
func (w *policyWorld) createPodCert(t *testing.T, name, ns, sa, node string) string {
	t.Helper()
	stub, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, w.key)
	if err != nil {
		t.Fatal(err)
	}
	pod, acct := w.pods[ns+"/"+name], w.accounts[ns+"/"+sa]
	pcr, err := w.f.s.cp.Client().CertificatesV1().PodCertificateRequests(ns).Create(t.Context(), &certv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-certs"},
		Spec: certv1.PodCertificateRequestSpec{SignerName: w.f.signer, PodName: pod.Name, PodUID: pod.UID,
			ServiceAccountName: sa, ServiceAccountUID: acct.UID, NodeName: types.NodeName(node), NodeUID: types.UID("uid-" + node),
			MaxExpirationSeconds: ptr.To[int32](86400), StubPKCS10Request: stub},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pcr.Name
}

func (w *policyWorld) getPodCert(t *testing.T, ns, name string) *certv1.PodCertificateRequest {
	t.Helper()
	pcr, err := w.f.s.cp.Client().CertificatesV1().PodCertificateRequests(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pcr
}

// podCert creates a PodCertificateRequest and waits until it is decided.
func (w *policyWorld) podCert(t *testing.T, name, ns, sa, node string) *certv1.PodCertificateRequest {
	t.Helper()
	pcrName := w.createPodCert(t, name, ns, sa, node)
	var pcr *certv1.PodCertificateRequest
	if err := pollUntil(t, lcWait, func() (bool, error) {
		pcr = w.getPodCert(t, ns, pcrName)
		return len(pcr.Status.Conditions) > 0, nil
	}); err != nil {
		t.Fatalf("request %s/%s was not decided: %v", ns, pcrName, err)
	}
	return pcr
}

func conditionOf(pcr *certv1.PodCertificateRequest) metav1.Condition {
	if len(pcr.Status.Conditions) == 0 {
		return metav1.Condition{Type: "(none)"}
	}
	return pcr.Status.Conditions[0]
}

// ensurePolicyCRD installs the chart's IssuancePolicy CRD, as helm install
// does from crds/, and waits until it is served.
func ensurePolicyCRD(t *testing.T, s *suite) {
	t.Helper()
	if err := s.cp.InstallCRD(t.Context(), filepath.Join(chartDir, "crds", "workload-ca.io_issuancepolicies.yaml")); err != nil {
		t.Fatal(err)
	}
}
