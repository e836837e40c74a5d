package podindex

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/authz"
)

// fixture is an Index over a fake API holding apiPods, with indexed pods
// already in the store, counting the API calls made.
type fixture struct {
	idx    *Index
	client *fake.Clientset
	calls  atomic.Int32
}

func newFixture(t *testing.T, cfg Config, indexed []*corev1.Pod, apiPods ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{client: fake.NewClientset(apiPods...)}
	f.client.PrependReactor("*", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		f.calls.Add(1)
		return false, nil, nil
	})
	cfg.Client = f.client
	cfg.Logger = slog.New(slog.DiscardHandler)
	if cfg.Clock == nil {
		cfg.Clock = testingclock.NewFakePassiveClock(time.Unix(1e9, 0))
	}
	f.idx = New(cfg)
	for _, p := range indexed {
		mustNil(t, "Add", f.idx.store.Add(p))
	}
	return f
}

// react puts fn in front of the fake API for pods; calls it handles count.
func (f *fixture) react(verb string, fn k8stesting.ReactionFunc) {
	f.client.PrependReactor(verb, "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		handled, obj, err := fn(a)
		if handled {
			f.calls.Add(1)
		}
		return handled, obj, err
	})
}

// failWith makes every pod API call fail with err.
func (f *fixture) failWith(err error) {
	f.react("*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, err
	})
}

func (f *fixture) wantCalls(t *testing.T, want int32) {
	t.Helper()
	if got := f.calls.Load(); got != want {
		t.Errorf("API calls = %d, want %d", got, want)
	}
}

var errBoom = apierrors.NewServiceUnavailable("etcd is sad")

func TestPod(t *testing.T) {
	indexed := running(uid1, "shop", "checkout", "node-a")
	tests := []struct {
		name      string
		ns, pod   string
		uid       string
		apiPods   []runtime.Object
		apiErr    error
		want      authz.PodInfo
		wantFound bool
		wantErr   error
		wantCalls int32
	}{
		{name: "index hit", ns: "shop", pod: "whatever", uid: uid1,
			want: authz.PodInfo{UID: uid1, NodeName: "node-a", ServiceAccount: "checkout"}, wantFound: true},
		{name: "index hit in another namespace", ns: "bank", pod: indexed.Name, uid: uid1},
		{name: "miss, live pod in the API", ns: "shop", pod: "pod-" + uid2, uid: uid2,
			apiPods:   []runtime.Object{running(uid2, "shop", "cart", "node-b")},
			want:      authz.PodInfo{UID: uid2, NodeName: "node-b", ServiceAccount: "cart"},
			wantFound: true, wantCalls: 1},
		{name: "miss, API pod has another uid", ns: "shop", pod: "pod-" + uid2, uid: uid3,
			apiPods: []runtime.Object{running(uid2, "shop", "cart", "node-b")}, wantCalls: 1},
		{name: "miss, API pod terminal", ns: "shop", pod: "pod-" + uid2, uid: uid2,
			apiPods: []runtime.Object{testPod(uid2, "shop", "cart", "node-b", corev1.PodSucceeded)}, wantCalls: 1},
		{name: "miss, API pod unscheduled", ns: "shop", pod: "pod-" + uid2, uid: uid2,
			apiPods: []runtime.Object{running(uid2, "shop", "cart", "")}, wantCalls: 1},
		{name: "miss, not in the API", ns: "shop", pod: "pod-" + uid2, uid: uid2, wantCalls: 1},
		{name: "miss, API error", ns: "shop", pod: "pod-" + uid2, uid: uid2, apiErr: errBoom,
			wantErr: authz.ErrUnavailable, wantCalls: 1},
		{name: "empty uid never looks up", ns: "shop", pod: "pod-" + uid2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Config{}, []*corev1.Pod{indexed}, tc.apiPods...)
			if tc.apiErr != nil {
				f.failWith(tc.apiErr)
			}
			got, found, err := f.idx.Pod(context.Background(), tc.ns, tc.pod, tc.uid)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("Pod() error = %v, want %v", err, tc.wantErr)
			}
			if got != tc.want || found != tc.wantFound {
				t.Errorf("Pod() = %+v, %v; want %+v, %v", got, found, tc.want, tc.wantFound)
			}
			f.wantCalls(t, tc.wantCalls)
		})
	}
}

func TestServiceAccountOnNode(t *testing.T) {
	indexed := running(uid1, "shop", "checkout", "node-a")
	tests := []struct {
		name         string
		node, ns, sa string
		apiPods      []runtime.Object
		apiErr       error
		want         bool
		wantErr      error
		wantCalls    int32
	}{
		{name: "index hit", node: "node-a", ns: "shop", sa: "checkout", want: true},
		{name: "miss, live pod in the API", node: "node-b", ns: "shop", sa: "cart",
			apiPods: []runtime.Object{running(uid2, "shop", "cart", "node-b")}, want: true, wantCalls: 1},
		// The fake ignores field selectors: these check the client-side filter.
		{name: "miss, API pod of another service account", node: "node-b", ns: "shop", sa: "cart",
			apiPods: []runtime.Object{running(uid2, "shop", "checkout", "node-b")}, wantCalls: 1},
		{name: "miss, API pod on another node", node: "node-b", ns: "shop", sa: "cart",
			apiPods: []runtime.Object{running(uid2, "shop", "cart", "node-c")}, wantCalls: 1},
		{name: "miss, API pod failed", node: "node-b", ns: "shop", sa: "cart",
			apiPods: []runtime.Object{testPod(uid2, "shop", "cart", "node-b", corev1.PodFailed)}, wantCalls: 1},
		{name: "miss, API error", node: "node-b", ns: "shop", sa: "cart", apiErr: errBoom,
			wantErr: authz.ErrUnavailable, wantCalls: 1},
		{name: "empty node never looks up", node: "", ns: "shop", sa: "cart",
			apiPods: []runtime.Object{running(uid2, "shop", "cart", "")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Config{}, []*corev1.Pod{indexed}, tc.apiPods...)
			if tc.apiErr != nil {
				f.failWith(tc.apiErr)
			}
			got, err := f.idx.ServiceAccountOnNode(context.Background(), tc.node, tc.ns, tc.sa)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("ServiceAccountOnNode() error = %v, want %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("ServiceAccountOnNode() = %v, want %v", got, tc.want)
			}
			f.wantCalls(t, tc.wantCalls)
		})
	}
}

func TestAPIErrorKeepsCause(t *testing.T) {
	f := newFixture(t, Config{}, nil)
	f.failWith(errBoom)
	_, _, err := f.idx.Pod(context.Background(), "shop", "p", uid2)
	if !errors.Is(err, authz.ErrUnavailable) || !apierrors.IsServiceUnavailable(err) {
		t.Errorf("err = %v, want ErrUnavailable wrapping the API error", err)
	}
}

// A spent lookup budget is an overload refusal with a time to come back,
// never "not found" (which the token check would cache and the policy
// would deny on): the pod exists, informer lag is what the lookup is for.
func TestLookupBudgetRefusesAsOverloadNotNotFound(t *testing.T) {
	live := running(uid2, "shop", "cart", "node-b")
	f := newFixture(t, Config{LookupRate: 0.001, LookupBurst: 1}, nil, live)
	ctx := context.Background()
	if _, found, err := f.idx.Pod(ctx, "shop", live.Name, uid2); !found || err != nil {
		t.Fatalf("first lookup: found=%v err=%v, want found", found, err)
	}
	var oe *authz.OverloadError
	if _, found, err := f.idx.Pod(ctx, "shop", live.Name, uid2); found || !errors.As(err, &oe) || oe.RetryAfter <= 0 {
		t.Errorf("second Pod lookup: found=%v err=%v, want an overload refusal with a retry-after", found, err)
	}
	if ok, err := f.idx.ServiceAccountOnNode(ctx, "node-b", "shop", "cart"); ok || !errors.Is(err, authz.ErrOverloaded) {
		t.Errorf("ServiceAccountOnNode lookup: %v, %v; want an overload refusal", ok, err)
	}
	f.wantCalls(t, 1)
	if st := f.idx.Stats(); st.Lookups != 1 || st.LookupsRefused != 2 {
		t.Errorf("stats = %+v, want 1 lookup and 2 refused", st)
	}
}

// One node agent asking for identities that have no pod on its node spends
// its own share of the live lookups, not everyone's: another node's miss
// (a pod the watch has not delivered yet) is still looked up.
func TestLookupBudgetIsPerCaller(t *testing.T) {
	late := running(uid2, "shop", "cart", "node-b") // in the API, not yet in the index
	clk := testingclock.NewFakePassiveClock(time.Unix(1e9, 0))
	f := newFixture(t, Config{Clock: clk, LookupRatePerCaller: 1, LookupBurstPerCaller: 4}, nil, late)
	ctx := context.Background()
	refused := 0
	for n := range 100 {
		ok, err := f.idx.ServiceAccountOnNode(ctx, "node-a", "shop", fmt.Sprintf("nobody-%d", n))
		switch {
		case errors.Is(err, authz.ErrOverloaded):
			refused++
		case ok || err != nil:
			t.Fatalf("lookup %d of node-a: %v, %v", n, ok, err)
		}
	}
	if refused != 96 {
		t.Errorf("node-a: %d of 100 lookups refused, want 96 (burst 4)", refused)
	}
	if ok, err := f.idx.ServiceAccountOnNode(ctx, "node-b", "shop", "cart"); !ok || err != nil {
		t.Fatalf("node-b after node-a's flood: %v, %v; want found", ok, err)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	if _, err := f.idx.ServiceAccountOnNode(ctx, "node-a", "shop", "nobody"); err != nil {
		t.Errorf("node-a a second later: %v, want its budget refilled", err)
	}
	f.wantCalls(t, 6)
}

// TestOnNodeLookupRequest checks the LIST sent to the API, and that a short
// page with a continue token is followed.
func TestOnNodeLookupRequest(t *testing.T) {
	f := newFixture(t, Config{}, nil)
	var got []string
	f.react("list", func(a k8stesting.Action) (bool, runtime.Object, error) {
		opts := a.(k8stesting.ListActionImpl).GetListOptions()
		got = append(got, a.GetNamespace()+" "+opts.FieldSelector+" "+opts.Continue)
		if opts.Limit != lookupPageSize {
			t.Errorf("limit = %d, want %d", opts.Limit, lookupPageSize)
		}
		list := &corev1.PodList{}
		if opts.Continue == "" {
			list.Continue = "page2"
		} else {
			list.Items = []corev1.Pod{*running(uid2, "shop", "cart", "node-b")}
		}
		return true, list, nil
	})
	ok, err := f.idx.ServiceAccountOnNode(context.Background(), "node-b", "shop", "cart")
	if !ok || err != nil {
		t.Fatalf("ServiceAccountOnNode = %v, %v; want true", ok, err)
	}
	sel := "spec.nodeName=node-b,spec.serviceAccountName=cart,status.phase!=Failed,status.phase!=Succeeded"
	want := []string{"shop " + sel + " ", "shop " + sel + " page2"}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("requests = %q, want %q", got, want)
	}
}

func TestOnNodeLookupPageLimit(t *testing.T) {
	f := newFixture(t, Config{}, nil)
	f.react("list", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &corev1.PodList{ListMeta: metav1.ListMeta{Continue: "more"}}, nil
	})
	if ok, err := f.idx.ServiceAccountOnNode(context.Background(), "node-b", "shop", "cart"); ok || err != nil {
		t.Errorf("ServiceAccountOnNode = %v, %v; want false after the page limit", ok, err)
	}
	f.wantCalls(t, lookupMaxPages)
}

// TestLookupUsesTimeout runs against an HTTP server that never answers: the
// lookup must give up after LookupTimeout with ErrUnavailable.
func TestLookupUsesTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer srv.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	idx := New(Config{Client: client, Logger: slog.New(slog.DiscardHandler), LookupTimeout: 50 * time.Millisecond})
	start := time.Now()
	_, _, err = idx.Pod(context.Background(), "shop", "p", uid2)
	if !errors.Is(err, authz.ErrUnavailable) {
		t.Errorf("err = %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("lookup took %v, want about the 50ms timeout", d)
	}
}

// A pod stuck terminating lets its node agent ask for its service account
// only within the minute after its deletionTimestamp that Kubernetes
// accepts its tokens; another, running pod of that account on the node
// still does. The live lookup, on a miss, applies the same bound.
func TestTerminatingPodStopsAuthorizingNodeAgentAfterGrace(t *testing.T) {
	deleted := metav1.Unix(1e9, 0)
	terminating := func(uid, node string) *corev1.Pod {
		p := running(uid, "shop", "cart", node)
		p.DeletionTimestamp = &deleted
		return p
	}
	tests := []struct {
		name    string
		indexed []*corev1.Pod
		apiPods []runtime.Object
		node    string
		after   time.Duration
		want    bool
	}{
		{name: "indexed, within the grace", indexed: []*corev1.Pod{terminating(uid1, "node-a")}, node: "node-a", after: 59 * time.Second, want: true},
		{name: "indexed, past the grace", indexed: []*corev1.Pod{terminating(uid1, "node-a")}, node: "node-a", after: 61 * time.Second},
		{name: "indexed, past the grace, beside a running pod", node: "node-a", after: time.Hour, want: true,
			indexed: []*corev1.Pod{terminating(uid1, "node-a"), running(uid2, "shop", "cart", "node-a")}},
		{name: "indexed, past the grace, running pod elsewhere", node: "node-a", after: time.Hour,
			indexed: []*corev1.Pod{terminating(uid1, "node-a"), running(uid2, "shop", "cart", "node-b")}},
		{name: "live lookup, within the grace", apiPods: []runtime.Object{terminating(uid3, "node-c")}, node: "node-c", after: 30 * time.Second, want: true},
		{name: "live lookup, past the grace", apiPods: []runtime.Object{terminating(uid3, "node-c")}, node: "node-c", after: 2 * time.Minute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := testingclock.NewFakePassiveClock(deleted.Add(tc.after))
			f := newFixture(t, Config{Clock: clk}, tc.indexed, tc.apiPods...)
			got, err := f.idx.ServiceAccountOnNode(t.Context(), tc.node, "shop", "cart")
			if err != nil || got != tc.want {
				t.Fatalf("ServiceAccountOnNode = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// The terminating count follows a pod through deletion, cancellation and
// removal, so a running pod is never shadowed by one that left.
func TestTerminatingCountFollowsPods(t *testing.T) {
	s := newStore(slog.New(slog.DiscardHandler))
	at := metav1.Unix(1e9, 0)
	a := running(uid1, "shop", "cart", "node-a")
	b := running(uid2, "shop", "cart", "node-a")
	ta := a.DeepCopy()
	ta.DeletionTimestamp = &at
	tb := b.DeepCopy()
	tb.DeletionTimestamp = &at
	late := at.Unix() + 61
	steps := []struct {
		name string
		op   func() error
		want bool
	}{
		{"one running pod", func() error { return s.Add(a) }, true},
		{"it terminates", func() error { return s.Update(ta) }, false},
		{"a second pod runs", func() error { return s.Add(b) }, true},
		{"it terminates too", func() error { return s.Update(tb) }, false},
		{"its deletion is withdrawn", func() error { return s.Update(b) }, true},
		{"the first is deleted", func() error { return s.Delete(ta) }, true},
		{"the second terminates again", func() error { return s.Update(tb) }, false},
		{"and is deleted", func() error { return s.Delete(tb) }, false},
		{"a pod runs again", func() error { return s.Add(a) }, true},
	}
	for _, st := range steps {
		mustNil(t, st.name, st.op())
		if got := s.onNode("node-a", saName{"shop", "cart"}, late); got != st.want {
			t.Fatalf("%s: onNode past the grace = %v, want %v", st.name, got, st.want)
		}
	}
	if len(s.st.deleting) != 0 || len(s.st.onNode[0]) != 1 || s.st.onNode[0][0].terminating != 0 {
		t.Fatalf("left %d deletion timestamps, counts %+v", len(s.st.deleting), s.st.onNode)
	}
}
