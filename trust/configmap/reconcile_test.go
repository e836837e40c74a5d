package configmap

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testobs"
	"github.com/workload-ca/workload-ca/internal/testwait"
	"github.com/workload-ca/workload-ca/trust"
)

// state is what the tests compare of a ConfigMap.
type state struct {
	Namespace  string
	Data       map[string]string
	BinaryData map[string][]byte
	Labels     map[string]string
}

func stateOf(cm *corev1.ConfigMap) state {
	return state{cm.Namespace, cm.Data, cm.BinaryData, cm.Labels}
}

// with returns a copy of m with kv (key, value, key, value...) added.
func with(m map[string]string, kv ...string) map[string]string {
	out := maps.Clone(m)
	if out == nil {
		out = map[string]string{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// TestReconcile runs reconcile against the fake clientset, with the
// informer stores filled by hand, and compares the ConfigMaps left behind
// and the writes made, in order.
func TestReconcile(t *testing.T) {
	roots := testca.RootCerts(t, 3)
	cur := mustContent(t, roots[0], roots[1])
	other := mustContent(t, roots[2])
	ours := ownLabels(testTD)
	right := configMap("app", map[string]string{DataKey: cur}, ours)
	istiods := configMap("app", map[string]string{DataKey: other, "extra": "kept"},
		map[string]string{LabelIstioConfig: "true", "team": "mesh"})
	deleting := namespace("app", nil)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	terminating := namespace("app", nil)
	terminating.Status.Phase = corev1.NamespaceTerminating
	nsTerminatingErr := &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `configmaps "istio-ca-root-cert" is forbidden: unable to create new content in namespace app because it is being terminated`,
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause}}},
	}}

	tests := []struct {
		name     string
		ns       *corev1.Namespace // nil: not in the namespace cache
		selector labels.Selector
		noRoots  bool
		cached   []*corev1.ConfigMap // in the informer's cache and the cluster
		stale    []*corev1.ConfigMap // in the informer's cache only
		live     []*corev1.ConfigMap // in the cluster only: the cache lags
		reactor  k8stesting.ReactionFunc
		want     []*corev1.ConfigMap
		writes   []string // verbs, in order
		result   string
		wantErr  error
	}{
		{name: "absent: created", ns: namespace("app", nil),
			want: []*corev1.ConfigMap{right}, writes: []string{"create"}, result: trust.ResultCreated},
		{name: "already right: no write", ns: namespace("app", nil), cached: []*corev1.ConfigMap{right},
			want: []*corev1.ConfigMap{right}, result: trust.ResultUnchanged},
		{name: "root-cert.pem changed: updated", ns: namespace("app", nil),
			cached: []*corev1.ConfigMap{configMap("app", map[string]string{DataKey: other}, ours)},
			want:   []*corev1.ConfigMap{right}, writes: []string{"update"}, result: trust.ResultUpdated},
		{name: "labels edited: ours restored, others kept", ns: namespace("app", nil),
			cached: []*corev1.ConfigMap{configMap("app", map[string]string{DataKey: cur},
				map[string]string{"team": "x", LabelTrustDomain: "evil.org"})},
			want:   []*corev1.ConfigMap{configMap("app", map[string]string{DataKey: cur}, with(ours, "team", "x"))},
			writes: []string{"update"}, result: trust.ResultUpdated},
		{name: "foreign (istiod's) adopted: other keys and labels kept", ns: namespace("app", nil),
			cached: []*corev1.ConfigMap{istiods},
			want: []*corev1.ConfigMap{configMap("app", map[string]string{DataKey: cur, "extra": "kept"},
				with(ours, "team", "mesh"))},
			writes: []string{"update"}, result: trust.ResultUpdated},
		{name: "root-cert.pem in binaryData: moved to data", ns: namespace("app", nil),
			cached: []*corev1.ConfigMap{{ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: "app", Labels: ours},
				BinaryData: map[string][]byte{DataKey: []byte(other), "bin": {1}}}},
			want: []*corev1.ConfigMap{{ObjectMeta: right.ObjectMeta, Data: right.Data,
				BinaryData: map[string][]byte{"bin": {1}}}},
			writes: []string{"update"}, result: trust.ResultUpdated},
		{name: "deleted, cache current: re-created", ns: namespace("app", nil),
			want: []*corev1.ConfigMap{right}, writes: []string{"create"}, result: trust.ResultCreated},
		{name: "deleted, cache stale: update NotFound re-queues", ns: namespace("app", nil),
			stale:  []*corev1.ConfigMap{configMap("app", map[string]string{DataKey: other}, ours)},
			writes: []string{"update"}, result: trust.ResultRequeued, wantErr: trust.ErrRequeue},
		{name: "edited meanwhile: update Conflict re-queues", ns: namespace("app", nil),
			cached:  []*corev1.ConfigMap{configMap("app", map[string]string{DataKey: other}, ours)},
			reactor: failWith("update", apierrors.NewConflict(corev1.Resource("configmaps"), ConfigMapName, errors.New("changed"))),
			want:    []*corev1.ConfigMap{configMap("app", map[string]string{DataKey: other}, ours)},
			writes:  []string{"update"}, result: trust.ResultRequeued, wantErr: trust.ErrRequeue},
		{name: "cache lag: AlreadyExists on create, live copy updated", ns: namespace("app", nil),
			live: []*corev1.ConfigMap{istiods},
			want: []*corev1.ConfigMap{configMap("app", map[string]string{DataKey: cur, "extra": "kept"},
				with(ours, "team", "mesh"))},
			writes: []string{"create", "update"}, result: trust.ResultUpdated},
		{name: "cache lag: AlreadyExists on create, live copy right", ns: namespace("app", nil),
			live: []*corev1.ConfigMap{right},
			want: []*corev1.ConfigMap{right}, writes: []string{"create"}, result: trust.ResultUnchanged},
		{name: "namespace being deleted: skipped", ns: deleting, want: nil, result: trust.ResultSkipped},
		{name: "namespace terminating: skipped, ConfigMap left alone", ns: terminating,
			cached: []*corev1.ConfigMap{istiods}, want: []*corev1.ConfigMap{istiods}, result: trust.ResultSkipped},
		{name: "namespace not in cache: skipped", ns: nil, result: trust.ResultSkipped},
		{name: "namespace not selected: skipped", ns: namespace("app", map[string]string{"mesh": "off"}),
			selector: labels.SelectorFromSet(labels.Set{"mesh": "on"}), result: trust.ResultSkipped},
		{name: "namespace selected: created", ns: namespace("app", map[string]string{"mesh": "on"}),
			selector: labels.SelectorFromSet(labels.Set{"mesh": "on"}),
			want:     []*corev1.ConfigMap{right}, writes: []string{"create"}, result: trust.ResultCreated},
		{name: "namespace terminating per the apiserver: Forbidden on create is success", ns: namespace("app", nil),
			reactor: failWith("create", nsTerminatingErr), writes: []string{"create"}, result: trust.ResultSkipped},
		{name: "other Forbidden on create: error", ns: namespace("app", nil),
			reactor: failWith("create", apierrors.NewForbidden(corev1.Resource("configmaps"), ConfigMapName, errors.New("no"))),
			writes:  []string{"create"}, result: trust.ResultError, wantErr: errAPI},
		{name: "no roots: ErrInvalidRoots, nothing written", ns: namespace("app", nil), noRoots: true,
			cached: []*corev1.ConfigMap{istiods}, want: []*corev1.ConfigMap{istiods},
			result: trust.ResultError, wantErr: ErrInvalidRoots},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs := &testca.Roots{}
			if !tc.noRoots {
				rs.Set(roots[1], roots[0], roots[1]) // unordered, with a duplicate
			}
			client, r := newTestRun(t, Config{NamespaceSelector: tc.selector, Options: trust.Options{Roots: rs.Get}},
				tc.ns, tc.cached, tc.stale, tc.live)
			if tc.reactor != nil {
				client.PrependReactor("*", "configmaps", tc.reactor)
			}
			result, err := r.reconcile(context.Background(), "app")
			if !matchErr(err, tc.wantErr) {
				t.Fatalf("reconcile error = %v, want %v", err, tc.wantErr)
			}
			if result != tc.result {
				t.Errorf("result = %q, want %q", result, tc.result)
			}
			if diff := cmp.Diff(states(tc.want), listStates(t, client)); diff != "" {
				t.Errorf("ConfigMaps (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.writes, testobs.WriteVerbs(client)); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
		})
	}
}

// errAPI in a test case stands for any error that is neither
// trust.ErrRequeue nor ErrInvalidRoots.
var errAPI = errors.New("API error")

func matchErr(err, want error) bool {
	if want == errAPI { //nolint:errorlint // comparing test sentinels
		return err != nil && !errors.Is(err, trust.ErrRequeue) && !errors.Is(err, ErrInvalidRoots)
	}
	if want == nil {
		return err == nil
	}
	return errors.Is(err, want)
}

// failWith is a reactor failing verb on ConfigMaps with err.
func failWith(verb string, err error) k8stesting.ReactionFunc {
	return func(a k8stesting.Action) (bool, runtime.Object, error) {
		return a.GetVerb() == verb, nil, err
	}
}

// newTestRun returns a run over a fake clientset. ns (if not nil) is in
// the cluster and the namespace cache; cached ConfigMaps are in the
// cluster and the ConfigMap cache, stale ones only in the cache, live ones
// only in the cluster. No informer runs.
func newTestRun(t *testing.T, cfg Config, ns *corev1.Namespace, cached, stale, live []*corev1.ConfigMap) (*fake.Clientset, *run) {
	t.Helper()
	var objs []runtime.Object
	if ns != nil {
		objs = append(objs, ns.DeepCopy())
	}
	for _, cm := range slices.Concat(cached, live) {
		objs = append(objs, cm.DeepCopy())
	}
	client := fake.NewClientset(objs...)
	cfg.Client, cfg.TrustDomain = client, testTD
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := newRun(p)
	if ns != nil {
		if err := r.namespaces.Add(ns.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	for _, cm := range slices.Concat(cached, stale) {
		if err := r.configMaps.Add(cm.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	client.ClearActions()
	return client, r
}

func states(cms []*corev1.ConfigMap) []state {
	out := make([]state, len(cms))
	for i, cm := range cms {
		out[i] = stateOf(cm)
	}
	slices.SortFunc(out, func(a, b state) int { return strings.Compare(a.Namespace, b.Namespace) })
	return out
}

func listStates(t *testing.T, client *fake.Clientset) []state {
	t.Helper()
	list, err := client.CoreV1().ConfigMaps(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cms := make([]*corev1.ConfigMap, len(list.Items))
	for i := range list.Items {
		cms[i] = &list.Items[i]
	}
	return states(cms)
}

// TestReconcileRootsReordered checks that the same roots in another order
// (or with duplicates) write nothing.
func TestReconcileRootsReordered(t *testing.T) {
	roots := testca.RootCerts(t, 2)
	rs := &testca.Roots{}
	rs.Set(roots[1], roots[0], roots[0])
	cm := configMap("app", map[string]string{DataKey: mustContent(t, roots...)}, ownLabels(testTD))
	client, r := newTestRun(t, Config{Options: trust.Options{Roots: rs.Get}}, namespace("app", nil), []*corev1.ConfigMap{cm}, nil, nil)
	result, err := r.reconcile(context.Background(), "app")
	if err != nil || result != trust.ResultUnchanged || len(testobs.WriteVerbs(client)) != 0 {
		t.Fatalf("reconcile = %q, %v with writes %v; want unchanged, no writes", result, err, testobs.WriteVerbs(client))
	}
}

// TestReconcileCacheLagThenDeleted: the informer has not seen the
// ConfigMap yet, so the create fails with AlreadyExists, and by the time
// the live object is read someone has deleted it: the namespace is
// re-queued rather than failed.
func TestReconcileCacheLagThenDeleted(t *testing.T) {
	roots := testca.RootCerts(t, 1)
	rs := &testca.Roots{}
	rs.Set(roots[0])
	live := configMap("app", map[string]string{DataKey: mustContent(t, roots[0])}, ownLabels(testTD))
	client, r := newTestRun(t, Config{Options: trust.Options{Roots: rs.Get}}, namespace("app", nil), nil, nil, []*corev1.ConfigMap{live})
	client.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(corev1.Resource("configmaps"), ConfigMapName)
	})
	result, err := r.reconcile(context.Background(), "app")
	if !errors.Is(err, trust.ErrRequeue) || result != trust.ResultRequeued {
		t.Fatalf("reconcile = %q, %v; want %q wrapping trust.ErrRequeue", result, err, trust.ResultRequeued)
	}
}

// TestReconcileContested: another writer (istiod's namespace controller,
// say) keeps putting its own roots into our ConfigMap. The first change
// is repaired at once and the writer named; a second one within the
// repair interval waits for the interval to end.
func TestReconcileContested(t *testing.T) {
	roots := testca.RootCerts(t, 3)
	rs := &testca.Roots{}
	rs.Set(roots[0])
	ours, theirs := mustContent(t, roots[0]), mustContent(t, roots[1])
	clk := testingclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	var logs bytes.Buffer
	client, r := newTestRun(t, Config{Options: trust.Options{Roots: rs.Get, Clock: clk, RepairInterval: time.Minute, Logger: slog.New(slog.NewTextHandler(&logs, nil))}},
		namespace("app", nil), []*corev1.ConfigMap{configMap("app", map[string]string{DataKey: ours}, ownLabels(testTD))}, nil, nil)
	ctx := context.Background()
	reconcile := func(want string) {
		t.Helper()
		if result, err := r.reconcile(ctx, "app"); err != nil || result != want {
			t.Fatalf("reconcile = %q, %v; want %q", result, err, want)
		}
	}
	// rival writes its roots as the field manager istiod's has, and drops
	// our labels if told to.
	rival := func(dropLabels bool) {
		t.Helper()
		cm, err := client.CoreV1().ConfigMaps("app").Get(ctx, ConfigMapName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data[DataKey] = theirs
		if dropLabels {
			cm.Labels = nil
		}
		if cm, err = client.CoreV1().ConfigMaps("app").Update(ctx, cm, metav1.UpdateOptions{FieldManager: "pilot-discovery"}); err != nil {
			t.Fatal(err)
		}
		if err := r.configMaps.Update(cm); err != nil {
			t.Fatal(err)
		}
	}
	holds := func(want string) {
		t.Helper()
		cm, err := client.CoreV1().ConfigMaps("app").Get(ctx, ConfigMapName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cm.Data[DataKey] != want {
			t.Fatalf("ConfigMap holds the wrong roots")
		}
	}

	reconcile(trust.ResultUnchanged)
	rival(false)
	reconcile(trust.ResultRepaired)
	holds(ours)
	if !strings.Contains(logs.String(), "another writer changed the roots") || !strings.Contains(logs.String(), "pilot-discovery") {
		t.Fatalf("the repair was not logged with the other writer:\n%s", logs.String())
	}

	// Dropping our labels does not make it a ConfigMap to adopt at once.
	clk.Step(10 * time.Second)
	rival(true)
	reconcile(trust.ResultDeferred)
	holds(theirs)
	clk.Step(50 * time.Second) // the interval since the repair has passed
	testwait.Eventually(t, "namespace re-queued after the interval", func() bool { return r.queue.Len() == 1 })
	reconcile(trust.ResultRepaired)
	holds(ours)

	// Our own change of roots is not someone else's edit.
	cm, err := client.CoreV1().ConfigMaps("app").Get(ctx, ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.configMaps.Update(cm); err != nil { // the informer's view of our repair
		t.Fatal(err)
	}
	rs.Set(roots[2])
	reconcile(trust.ResultUpdated)

	// A new leader has no history, but the stamp its predecessor left says
	// what was written: another writer's edit is still repaired, and a
	// change of our own roots is still an update.
	leader := func() *run {
		t.Helper()
		next := newRun(r.p)
		cm, err := client.CoreV1().ConfigMaps("app").Get(ctx, ConfigMapName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(next.namespaces.Add(namespace("app", nil)), next.configMaps.Add(cm)); err != nil {
			t.Fatal(err)
		}
		return next
	}
	rival(false)
	if result, err := leader().reconcile(ctx, "app"); err != nil || result != trust.ResultRepaired {
		t.Fatalf("new leader, another writer's roots: reconcile = %q, %v; want %q", result, err, trust.ResultRepaired)
	}
	holds(mustContent(t, roots[2]))
	rs.Set(roots[0])
	if result, err := leader().reconcile(ctx, "app"); err != nil || result != trust.ResultUpdated {
		t.Fatalf("new leader, our roots changed: reconcile = %q, %v; want %q", result, err, trust.ResultUpdated)
	}
	holds(ours)
}
