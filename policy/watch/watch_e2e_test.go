package watch

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/internal/testlog"
	"github.com/workload-ca/workload-ca/internal/testwait"
	"github.com/workload-ca/workload-ca/issuance"
	"github.com/workload-ca/workload-ca/policy"
)

const crdFile = "../../deploy/charts/workload-ca/crds/workload-ca.io_issuancepolicies.yaml"

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

// replica is one CA replica's watcher, on its own fake clock.
type replica struct {
	w     *Watcher
	clock *testingclock.FakeClock
}

func startReplica(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, wg *sync.WaitGroup) replica {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	meta, err := metadata.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	compiler, err := policy.NewCompiler()
	if err != nil {
		t.Fatal(err)
	}
	clock := testingclock.NewFakeClock(time.Now())
	w, err := New(Config{Policies: dyn, Metadata: meta, Cluster: "c1", Compiler: compiler, Clock: clock, StatusInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Decide(t.Context(), issuance.DoorGRPC, request("team-a"), id("team-a", "api")); !errors.Is(err, issuance.ErrNotReady) {
		t.Fatalf("before the policies are listed: %v, want not ready", err)
	}
	wg.Go(func() {
		if err := w.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	testwait.Eventually(t, "the watcher ready", func() bool { return w.Ready(t.Context()) == nil })
	return replica{w: w, clock: clock}
}

func id(ns, sa string) spiffeid.ID { return spiffeid.RequireFromPath(td, "/ns/"+ns+"/sa/"+sa) }

func request(ns string) *issuance.Request {
	return &issuance.Request{Caller: authz.Caller{Namespace: ns, ServiceAccount: "x", NodeName: "node-a"},
		CallerKind: issuance.CallerWorkload, Cluster: "c1", TTL: 24 * time.Hour}
}

// TestE2E runs two replicas' watchers against a real API server: they
// decide by the policies installed, follow a change of spec at once, add
// up their decisions in each policy's status, refuse what depends on a
// namespace they have not seen, and fail closed on a policy that does not
// compile.
func TestE2E(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	if err := cp.InstallCRD(ctx, crdFile); err != nil {
		t.Fatal(err)
	}
	nss := cp.Client().CoreV1().Namespaces()
	if _, err := nss.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"team": "a"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	client := dyn.Resource(GVR)
	create(t, client, "no-default", policy.Spec{Validations: []policy.Validation{{Expression: "identityServiceAccount != 'default'", Message: "no default"}}})
	create(t, client, "team-a-short", policy.Spec{Match: policy.Match{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}},
		MaxTTL: "duration('1h')"})

	r1, r2 := startReplica(ctx, t, cp, &wg), startReplica(ctx, t, cp, &wg)
	for _, r := range []replica{r1, r1, r2} {
		_, err := r.w.Decide(ctx, issuance.DoorGRPC, request("team-a"), id("team-a", "default"))
		if pe := (*issuance.PolicyError)(nil); !errors.As(err, &pe) || pe.Policy != "no-default" {
			t.Fatalf("the default service account: %v, want denied by no-default", err)
		}
	}
	v, err := r2.w.Decide(ctx, issuance.DoorGRPC, request("team-a"), id("team-a", "api"))
	if err != nil || v.MaxTTL != time.Hour {
		t.Fatalf("team-a/api: %+v, %v; want capped at 1h", v, err)
	}

	t.Run("each replica's decisions add up in the status", func(t *testing.T) {
		waitStatus(t, client, []replica{r1, r2}, "no-default", func(st policy.Status) bool {
			return st.Decisions.Denied == 3 && st.Decisions.Selected == 4 && compiled(st) == metav1.ConditionTrue
		})
		waitStatus(t, client, []replica{r1, r2}, "team-a-short", func(st policy.Status) bool { return st.Decisions.TTLCapped == 1 })
	})

	t.Run("a namespace not seen yet cannot be decided by its labels", func(t *testing.T) {
		_, err := r1.w.Decide(ctx, issuance.DoorGRPC, request("team-new"), id("team-new", "api"))
		if !errors.Is(err, issuance.ErrPolicyUnavailable) {
			t.Fatalf("%v, want unavailable", err)
		}
	})

	t.Run("a change of spec is followed, and its generation's condition written", func(t *testing.T) {
		u, err := client.Get(ctx, "no-default", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedSlice(u.Object, []any{map[string]any{"expression": "identityServiceAccount != 'legacy'"}}, "spec", "validations"); err != nil {
			t.Fatal(err)
		}
		if u, err = client.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.Eventually(t, "the new spec decides", func() bool {
			_, e1 := r1.w.Decide(ctx, issuance.DoorGRPC, request("team-a"), id("team-a", "default"))
			_, e2 := r2.w.Decide(ctx, issuance.DoorGRPC, request("team-a"), id("team-a", "legacy"))
			return e1 == nil && e2 != nil
		})
		waitStatus(t, client, []replica{r1, r2}, "no-default", func(st policy.Status) bool {
			return st.ObservedGeneration == u.GetGeneration() && compiled(st) == metav1.ConditionTrue && st.Decisions.Denied >= 4
		})
	})

	t.Run("a policy that does not compile refuses what it selects, and says why", func(t *testing.T) {
		create(t, client, "broken", policy.Spec{Match: policy.Match{Doors: []string{"podcert"}}, Validations: []policy.Validation{{Expression: "identity ==="}}})
		testwait.Eventually(t, "the broken policy refuses", func() bool {
			_, err := r1.w.Decide(ctx, issuance.DoorPodCertificate, request("team-a"), id("team-a", "api"))
			return errors.Is(err, issuance.ErrPolicyUnavailable)
		})
		if _, err := r1.w.Decide(ctx, issuance.DoorGRPC, request("team-a"), id("team-a", "api")); err != nil {
			t.Errorf("a door it does not select: %v", err)
		}
		waitStatus(t, client, []replica{r1, r2}, "broken", func(st policy.Status) bool {
			return compiled(st) == metav1.ConditionFalse && st.Decisions.Unavailable >= 1
		})
	})

	t.Run("a policy deleted and created again starts its counts afresh", func(t *testing.T) {
		if err := client.Delete(ctx, "team-a-short", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.Eventually(t, "the deletion seen", func() bool {
			v, err := r1.w.Decide(ctx, issuance.DoorGRPC, request("team-a"), id("team-a", "api"))
			return err == nil && v.MaxTTL == 0
		})
		create(t, client, "team-a-short", policy.Spec{MaxTTL: "duration('2h')"})
		testwait.Eventually(t, "the new policy decides", func() bool {
			v, err := r1.w.Decide(ctx, issuance.DoorGRPC, request("team-a"), id("team-a", "api"))
			return err == nil && v.MaxTTL == 2*time.Hour
		})
		waitStatus(t, client, []replica{r1, r2}, "team-a-short", func(st policy.Status) bool {
			return compiled(st) == metav1.ConditionTrue && st.Decisions.TTLCapped >= 1
		})
		if st := status(t, client, "team-a-short"); st.Decisions.TTLCapped > 2 {
			t.Errorf("the new policy counts %d capped, the old one's included", st.Decisions.TTLCapped)
		}
	})
}

// A policy the CA cannot read (a field it does not know) is not
// decided by what it could read.
func TestToPolicyStrict(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": policy.Group + "/" + policy.Version, "kind": policy.Kind,
		"metadata": map[string]any{"name": "newer"},
		"spec":     map[string]any{"denyAll": true},
	}}
	if _, err := toPolicy(u); err == nil || !strings.Contains(err.Error(), "denyAll") {
		t.Fatalf("toPolicy: %v, want an error naming the unknown field", err)
	}
	w := &Watcher{cfg: Config{Compiler: mustCompiler(t), Logger: testlog.New(t)}}
	if c := w.compile(u); c.Err == nil {
		t.Fatal("compiled a policy with an unknown field")
	}
}

func mustCompiler(t *testing.T) *policy.Compiler {
	t.Helper()
	c, err := policy.NewCompiler()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func create(t *testing.T, client dynamic.ResourceInterface, name string, spec policy.Spec) {
	t.Helper()
	p := &policy.IssuancePolicy{TypeMeta: metav1.TypeMeta{APIVersion: policy.Group + "/" + policy.Version, Kind: policy.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Create(t.Context(), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func status(t *testing.T, client dynamic.ResourceInterface, name string) policy.Status {
	t.Helper()
	u, err := client.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return statusOf(u)
}

// waitStatus steps the replicas' clocks (each writes its status then)
// until ok holds of the policy's status.
func waitStatus(t *testing.T, client dynamic.ResourceInterface, rs []replica, name string, ok func(policy.Status) bool) {
	t.Helper()
	var st policy.Status
	testwait.Eventually(t, "the status of "+name, func() bool {
		for _, r := range rs {
			r.clock.Step(time.Second)
		}
		st = status(t, client, name)
		return ok(st)
	})
	t.Logf("%s: %+v", name, st.Decisions)
}

func compiled(st policy.Status) metav1.ConditionStatus {
	for _, c := range st.Conditions {
		if c.Type == policy.ConditionCompiled {
			return c.Status
		}
	}
	return metav1.ConditionUnknown
}
