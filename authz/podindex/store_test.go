package podindex

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

const (
	uid1 = "0b4f7a52-6d1c-4e8a-9f3b-2c5d8e1a7b60"
	uid2 = "1c5a8b63-7e2d-4f9b-8a4c-3d6e9f2b8c71"
	uid3 = "2d6b9c74-8f3e-4a0c-9b5d-4e7f0a3c9d82"
)

func testPod(uid, ns, sa, node string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-" + uid, Namespace: ns, UID: types.UID(uid)},
		Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: sa},
		Status:     corev1.PodStatus{Phase: phase},
	}
}

func running(uid, ns, sa, node string) *corev1.Pod {
	return testPod(uid, ns, sa, node, corev1.PodRunning)
}

type storeOp func(t *testing.T, s *store)

func add(obj any) storeOp {
	return func(t *testing.T, s *store) { mustNil(t, "Add", s.Add(obj)) }
}

func update(obj any) storeOp {
	return func(t *testing.T, s *store) { mustNil(t, "Update", s.Update(obj)) }
}

func del(obj any) storeOp {
	return func(t *testing.T, s *store) { mustNil(t, "Delete", s.Delete(obj)) }
}

func replace(objs ...any) storeOp {
	return func(t *testing.T, s *store) { mustNil(t, "Replace", s.Replace(objs, "1")) }
}

func mustNil(t *testing.T, op string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
}

type onNodeQuery struct {
	node, ns, sa string
	want         bool
}

func TestStore(t *testing.T) {
	p1 := running(uid1, "shop", "checkout", "node-a")
	p2 := running(uid2, "shop", "checkout", "node-a")
	p3 := running(uid3, "shop", "cart", "node-b")
	tests := []struct {
		name   string
		ops    []storeOp
		onNode []onNodeQuery
		has    map[string]bool
		stats  Stats
	}{{
		name: "pod on node is found",
		ops:  []storeOp{add(p1)},
		onNode: []onNodeQuery{
			{"node-a", "shop", "checkout", true},
			{"node-b", "shop", "checkout", false},
			{"node-a", "shop", "cart", false},
			{"node-a", "other", "checkout", false},
		},
		has:   map[string]bool{uid1: true, uid2: false},
		stats: Stats{Pods: 1, Nodes: 1, ServiceAccounts: 1},
	}, {
		name:   "deleted pod is gone and its names are released",
		ops:    []storeOp{add(p1), del(p1)},
		onNode: []onNodeQuery{{"node-a", "shop", "checkout", false}},
		has:    map[string]bool{uid1: false},
	}, {
		name: "pod moved to another node",
		ops:  []storeOp{add(p1), update(running(uid1, "shop", "checkout", "node-b"))},
		onNode: []onNodeQuery{
			{"node-a", "shop", "checkout", false},
			{"node-b", "shop", "checkout", true},
		},
		has:   map[string]bool{uid1: true},
		stats: Stats{Pods: 1, Nodes: 1, ServiceAccounts: 1},
	}, {
		name:   "two pods of one service account on a node, one deleted",
		ops:    []storeOp{add(p1), add(p2), del(p1)},
		onNode: []onNodeQuery{{"node-a", "shop", "checkout", true}},
		has:    map[string]bool{uid1: false, uid2: true},
		stats:  Stats{Pods: 1, Nodes: 1, ServiceAccounts: 1},
	}, {
		name:   "two pods of one service account on a node, both deleted",
		ops:    []storeOp{add(p1), add(p2), del(p1), del(p2)},
		onNode: []onNodeQuery{{"node-a", "shop", "checkout", false}},
	}, {
		name:   "repeated add of the same pod counts once",
		ops:    []storeOp{add(p1), add(p1), update(p1), del(p1)},
		onNode: []onNodeQuery{{"node-a", "shop", "checkout", false}},
	}, {
		name:   "failed via update is removed",
		ops:    []storeOp{add(p1), update(testPod(uid1, "shop", "checkout", "node-a", corev1.PodFailed))},
		onNode: []onNodeQuery{{"node-a", "shop", "checkout", false}},
		has:    map[string]bool{uid1: false},
	}, {
		name:   "succeeded via update is removed",
		ops:    []storeOp{add(p1), add(p2), update(testPod(uid1, "shop", "checkout", "node-a", corev1.PodSucceeded))},
		onNode: []onNodeQuery{{"node-a", "shop", "checkout", true}},
		has:    map[string]bool{uid1: false, uid2: true},
		stats:  Stats{Pods: 1, Nodes: 1, ServiceAccounts: 1},
	}, {
		name:   "unscheduled pod is ignored until bound",
		ops:    []storeOp{add(running(uid1, "shop", "checkout", ""))},
		onNode: []onNodeQuery{{"", "shop", "checkout", false}},
		has:    map[string]bool{uid1: false},
	}, {
		name: "pending pod counts once bound",
		ops: []storeOp{
			add(testPod(uid1, "shop", "checkout", "", corev1.PodPending)),
			update(testPod(uid1, "shop", "checkout", "node-a", corev1.PodPending)),
		},
		onNode: []onNodeQuery{{"node-a", "shop", "checkout", true}},
		has:    map[string]bool{uid1: true},
		stats:  Stats{Pods: 1, Nodes: 1, ServiceAccounts: 1},
	}, {
		name: "node id reused after its last pod left",
		ops:  []storeOp{add(p1), del(p1), add(p3)},
		onNode: []onNodeQuery{
			{"node-a", "shop", "checkout", false},
			{"node-b", "shop", "checkout", false},
			{"node-b", "shop", "cart", true},
		},
		stats: Stats{Pods: 1, Nodes: 1, ServiceAccounts: 1},
	}, {
		name:  "pod without uid is ignored",
		ops:   []storeOp{add(running("", "shop", "checkout", "node-a"))},
		stats: Stats{},
	}, {
		name:   "delete of an unknown uid is harmless",
		ops:    []storeOp{add(p1), del(p3)},
		onNode: []onNodeQuery{{"node-a", "shop", "checkout", true}},
		stats:  Stats{Pods: 1, Nodes: 1, ServiceAccounts: 1},
	}, {
		name: "tombstones of pods and podRefs delete",
		ops: []storeOp{add(p1), add(p3),
			del(cache.DeletedFinalStateUnknown{Key: "shop/a", Obj: p1}),
			del(cache.DeletedFinalStateUnknown{Key: "shop/c", Obj: refOf(p3)})},
		has: map[string]bool{uid1: false, uid3: false},
	}, {
		name: "replace drops stale entries",
		ops:  []storeOp{add(p1), add(p2), replace(p2, refOf(p3))},
		onNode: []onNodeQuery{
			{"node-a", "shop", "checkout", true},
			{"node-b", "shop", "cart", true},
		},
		has:   map[string]bool{uid1: false, uid2: true, uid3: true},
		stats: Stats{Pods: 2, Nodes: 2, ServiceAccounts: 2},
	}, {
		name:  "replace with nothing empties the index",
		ops:   []storeOp{add(p1), add(p3), replace()},
		has:   map[string]bool{uid1: false, uid3: false},
		stats: Stats{},
	}, {
		name: "replace skips terminal and unscheduled pods",
		ops: []storeOp{replace(
			testPod(uid1, "shop", "checkout", "node-a", corev1.PodFailed),
			running(uid2, "shop", "checkout", ""),
		)},
		onNode: []onNodeQuery{{"node-a", "shop", "checkout", false}},
		has:    map[string]bool{uid1: false, uid2: false},
	}, {
		name:   "non-uuid uid works",
		ops:    []storeOp{add(running("not-a-uuid", "shop", "checkout", "node-a"))},
		has:    map[string]bool{"not-a-uuid": true, "not-a-uuid2": false},
		onNode: []onNodeQuery{{"node-a", "shop", "checkout", true}},
		stats:  Stats{Pods: 1, Nodes: 1, ServiceAccounts: 1},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(slog.New(slog.DiscardHandler))
			for _, op := range tc.ops {
				op(t, s)
			}
			for _, q := range tc.onNode {
				if got := s.onNode(q.node, saName{q.ns, q.sa}, 0); got != q.want {
					t.Errorf("onNode(%q, %s/%s) = %v, want %v", q.node, q.ns, q.sa, got, q.want)
				}
			}
			for uid, want := range tc.has {
				if got := s.has(uid); got != want {
					t.Errorf("has(%q) = %v, want %v", uid, got, want)
				}
			}
			if diff := cmp.Diff(tc.stats, s.stats()); diff != "" {
				t.Errorf("stats (-want +got):\n%s", diff)
			}
			checkInvariants(t, s.st)
		})
	}
}

// checkInvariants recomputes the counts and references from the pods map.
func checkInvariants(t *testing.T, st *state) {
	t.Helper()
	counts := map[slot]int32{}
	nodeRefs, saRefs := map[uint32]int32{}, map[uint32]int32{}
	for _, sl := range st.pods {
		counts[sl]++
		nodeRefs[sl.node]++
		saRefs[sl.sa]++
	}
	got := map[slot]int32{}
	for node, list := range st.onNode {
		for _, c := range list {
			got[slot{uint32(node), c.sa}] = c.n
		}
	}
	if diff := cmp.Diff(counts, got); diff != "" {
		t.Errorf("per-node counts disagree with pods (-want +got):\n%s", diff)
	}
	checkRefs(t, "node", nodeRefs, st.nodes.refs, len(st.nodes.ids))
	checkRefs(t, "service account", saRefs, st.sas.refs, len(st.sas.ids))
}

func checkRefs(t *testing.T, what string, want map[uint32]int32, refs []int32, names int) {
	t.Helper()
	if names != len(want) {
		t.Errorf("%s table holds %d names, pods use %d", what, names, len(want))
	}
	for id, n := range refs {
		if n != want[uint32(id)] {
			t.Errorf("%s id %d: %d references, pods use %d", what, id, n, want[uint32(id)])
		}
	}
}

// TestStoreMatchesModel applies random events to the store and to a plain
// map of live pods, and compares every answer.
func TestStoreMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	s := newStore(slog.New(slog.DiscardHandler))
	model := map[string]*corev1.Pod{}
	pick := func(vals ...string) string { return vals[rng.IntN(len(vals))] }
	for step := range 5000 {
		uid := fmt.Sprintf("uid-%d", rng.IntN(100))
		p := testPod(uid, pick("a", "b"), pick("x", "y", "z"), pick("", "n1", "n2", "n3", "n4"),
			corev1.PodPhase(pick("Pending", "Running", "Running", "Succeeded", "Failed")))
		switch r := rng.IntN(10); {
		case r < 6:
			mustNil(t, "Update", s.Update(p))
			model[uid] = p
		case r < 9:
			mustNil(t, "Delete", s.Delete(p))
			delete(model, uid)
		default:
			list := []any{}
			for _, m := range model {
				list = append(list, refOf(m))
			}
			mustNil(t, "Replace", s.Replace(list, "1"))
		}
		if step%100 == 0 {
			compareModel(t, s, model)
		}
	}
	compareModel(t, s, model)
}

func compareModel(t *testing.T, s *store, model map[string]*corev1.Pod) {
	t.Helper()
	checkInvariants(t, s.st)
	want := map[string]bool{}
	for uid, p := range model {
		r, _ := recordOf(p)
		if r.live() {
			want[r.node+"/"+r.namespace+"/"+r.serviceAccount] = true
		}
		if got := s.has(uid); got != r.live() {
			t.Fatalf("has(%s) = %v, model says %v", uid, got, r.live())
		}
	}
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		for _, ns := range []string{"a", "b"} {
			for _, sa := range []string{"x", "y", "z"} {
				if got := s.onNode(n, saName{ns, sa}, 0); got != want[n+"/"+ns+"/"+sa] {
					t.Fatalf("onNode(%s, %s/%s) = %v, model says %v", n, ns, sa, got, !got)
				}
			}
		}
	}
}

func TestStoreRejects(t *testing.T) {
	s := newStore(slog.New(slog.DiscardHandler))
	mustNil(t, "Add", s.Add(running(uid1, "shop", "checkout", "node-a")))
	for name, obj := range map[string]any{
		"tombstone without object": cache.DeletedFinalStateUnknown{Key: "shop/a"},
		"not a pod":                &corev1.Node{},
	} {
		if err := s.Delete(obj); err == nil {
			t.Errorf("Delete(%s) = nil, want error", name)
		}
		if err := s.Add(obj); err == nil {
			t.Errorf("Add(%s) = nil, want error", name)
		}
	}
	mustNil(t, "Replace", s.Replace([]any{&corev1.Node{}, running(uid2, "shop", "cart", "node-b")}, "2"))
	if got, want := s.stats(), (Stats{Pods: 1, Nodes: 1, ServiceAccounts: 1}); got != want {
		t.Errorf("after replace with a non-pod: stats = %+v, want %+v", got, want)
	}
}

func TestStorePod(t *testing.T) {
	s := newStore(slog.New(slog.DiscardHandler))
	mustNil(t, "Add", s.Add(running(uid1, "shop", "checkout", "node-a")))
	p, ok := s.pod(uid1)
	if !ok || p != (indexedPod{sa: saName{"shop", "checkout"}, node: "node-a"}) {
		t.Errorf("pod(uid1) = %+v, %v", p, ok)
	}
	if _, ok := s.pod(uid2); ok {
		t.Errorf("pod(uid2) found, want miss")
	}
}

// TestStoreKeepsDeletionTimestamp: a terminating pod stays in the index
// (Kubernetes still accepts its token for a minute past its
// deletionTimestamp) and carries that timestamp until it is gone; a pod
// whose deletion was cancelled (never, in Kubernetes, but the store must
// not care) loses it.
func TestStoreKeepsDeletionTimestamp(t *testing.T) {
	s := newStore(slog.New(slog.DiscardHandler))
	pod := running(uid1, "shop", "checkout", "node-a")
	mustNil(t, "Add", s.Add(pod))
	terminating := pod.DeepCopy()
	at := metav1.Unix(1_900_000_000, 0)
	terminating.DeletionTimestamp = &at
	mustNil(t, "Update", s.Update(terminating))
	if p, ok := s.pod(uid1); !ok || p.deletion != at.Unix() {
		t.Errorf("terminating pod: pod(uid1) = %+v, %v; want deletion %d", p, ok, at.Unix())
	}
	if ns, deletion, ok := s.podNamespace(uid1); !ok || ns != "shop" || deletion != at.Unix() {
		t.Errorf("podNamespace(uid1) = %q, %d, %v", ns, deletion, ok)
	}
	mustNil(t, "Update", s.Update(pod))
	if p, _ := s.pod(uid1); p.deletion != 0 {
		t.Errorf("after an update without a deletionTimestamp: deletion = %d, want 0", p.deletion)
	}
	mustNil(t, "Update", s.Update(terminating))
	mustNil(t, "Delete", s.Delete(terminating))
	if len(s.st.deleting) != 0 {
		t.Errorf("deleted pod left %d deletion timestamps", len(s.st.deleting))
	}
	// The transform keeps the timestamp through a relist.
	ref, _ := compact(terminating)
	mustNil(t, "Replace", s.Replace([]any{ref}, "2"))
	if p, _ := s.pod(uid1); p.deletion != at.Unix() {
		t.Errorf("after a relist: deletion = %d, want %d", p.deletion, at.Unix())
	}
}

func (s *store) has(uid string) bool {
	_, ok := s.pod(uid)
	return ok
}

func (i *Index) hasPod(uid string) bool { return i.store.has(uid) }

func TestSyncedByFirstReplace(t *testing.T) {
	s := newStore(slog.New(slog.DiscardHandler))
	mustNil(t, "Add", s.Add(running(uid1, "shop", "checkout", "node-a")))
	if s.synced.Load() {
		t.Fatal("synced before the first Replace")
	}
	mustNil(t, "Replace", s.Replace(nil, "1"))
	mustNil(t, "Replace", s.Replace(nil, "2")) // must not close ready twice
	select {
	case <-s.ready:
	default:
		t.Fatal("ready not closed after Replace")
	}
}

func TestTransformIsIdempotent(t *testing.T) {
	p := running(uid1, "shop", "checkout", "node-a")
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	once, _ := compact(p)
	twice, _ := compact(once)
	if once != twice {
		t.Errorf("compact(compact(p)) changed the object")
	}
	want := &podRef{
		ObjectMeta:     metav1.ObjectMeta{Name: p.Name, Namespace: "shop", UID: uid1},
		NodeName:       "node-a",
		ServiceAccount: "checkout",
		Phase:          corev1.PodRunning,
	}
	if diff := cmp.Diff(want, once); diff != "" {
		t.Errorf("compact (-want +got):\n%s", diff)
	}
	if key, err := cache.MetaNamespaceKeyFunc(once); err != nil || key != "shop/"+p.Name {
		t.Errorf("key of podRef = %q, %v", key, err)
	}
}
