package podindex

import (
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/client-go/tools/cache"
)

// slot is where a pod runs: node id and service account id.
type slot struct{ node, sa uint32 }

// saCount is the number of live pods of one service account on a node, and
// how many of them are terminating.
type saCount struct {
	sa          uint32
	n           int32
	terminating int32
}

// state is the whole index. It is only touched under store.mu.
//
// The per-node lists replace a map[slot]int32: a node runs at most a few
// hundred pods (kubelet maxPods), so a scan of its list is as fast as a map
// probe and costs 8 bytes per (node, service account) instead of ~20.
type state struct {
	pods   map[uidKey]slot
	onNode [][]saCount // by node id
	nodes  interner[string]
	sas    interner[saName]
	// deleting holds the deletionTimestamp (Unix seconds) of the pods that
	// are terminating, a few at any time; the others have none.
	deleting map[uidKey]int64
}

func newState(sizeHint int) *state {
	return &state{
		pods:     make(map[uidKey]slot, sizeHint),
		nodes:    newInterner(strings.Clone),
		sas:      newInterner(cloneSAName),
		deleting: make(map[uidKey]int64),
	}
}

// count adds delta to the live pods of s.sa on s.node.
func (st *state) count(s slot, delta int32) {
	for int(s.node) >= len(st.onNode) {
		st.onNode = append(st.onNode, nil)
	}
	list := st.onNode[s.node]
	for j := range list {
		if list[j].sa != s.sa {
			continue
		}
		if list[j].n += delta; list[j].n <= 0 {
			list[j] = list[len(list)-1]
			list = list[:len(list)-1]
			if len(list) == 0 {
				list = nil // the node id may be reused for another node
			}
			st.onNode[s.node] = list
		}
		return
	}
	if delta > 0 {
		st.onNode[s.node] = append(list, saCount{sa: s.sa, n: delta})
	}
}

// countTerminating adds delta to the terminating pods of s.sa on s.node,
// which count already counts among its live pods.
func (st *state) countTerminating(s slot, delta int32) {
	if int(s.node) >= len(st.onNode) {
		return
	}
	list := st.onNode[s.node]
	for j := range list {
		if list[j].sa == s.sa {
			list[j].terminating += delta
			return
		}
	}
}

// running reports whether sa has a live pod on node that is not
// terminating, or has been terminating since cutoff (Unix seconds) or
// later.
func (st *state) running(node, sa uint32, cutoff int64) bool {
	if int(node) >= len(st.onNode) {
		return false
	}
	for _, c := range st.onNode[node] {
		if c.sa != sa {
			continue
		}
		if c.n > c.terminating {
			return true
		}
		// Every pod is terminating: one that began recently still counts.
		// Few pods terminate at a time, so the scan is short.
		want := slot{node, sa}
		for k, unix := range st.deleting {
			if unix >= cutoff && st.pods[k] == want {
				return true
			}
		}
		return false
	}
	return false
}

// put records a pod event: a live pod is (re)placed, any other is removed.
func (st *state) put(r record) {
	k := keyOf(r.uid)
	if !r.live() {
		st.remove(k)
		return
	}
	sa := saName{r.namespace, r.serviceAccount}
	if old, ok := st.pods[k]; ok {
		if st.nodes.key(old.node) == r.node && st.sas.key(old.sa) == sa {
			st.setDeletion(k, old, r.deletion)
			return
		}
		st.remove(k)
	}
	s := slot{st.nodes.acquire(r.node), st.sas.acquire(sa)}
	st.pods[k] = s
	st.count(s, 1)
	st.setDeletion(k, s, r.deletion)
}

// setDeletion records when pod k, counted in slot s, was marked for
// deletion (0: it is not).
func (st *state) setDeletion(k uidKey, s slot, unix int64) {
	_, was := st.deleting[k]
	switch {
	case unix == 0 && was:
		delete(st.deleting, k)
		st.countTerminating(s, -1)
	case unix != 0:
		st.deleting[k] = unix
		if !was {
			st.countTerminating(s, 1)
		}
	}
}

func (st *state) remove(k uidKey) {
	s, ok := st.pods[k]
	if !ok {
		return
	}
	st.setDeletion(k, s, 0)
	delete(st.pods, k)
	st.count(s, -1)
	st.nodes.release(s.node)
	st.sas.release(s.sa)
}

// store is the cache.ReflectorStore the reflector feeds. It keeps no
// objects: each event is reduced to a slot and dropped.
type store struct {
	log    *slog.Logger
	mu     sync.RWMutex
	st     *state
	synced atomic.Bool
	ready  chan struct{} // closed by the first Replace
}

var _ cache.TransformingStore = (*store)(nil)

func newStore(log *slog.Logger) *store {
	return &store{log: log, st: newState(0), ready: make(chan struct{})}
}

// Add implements cache.ReflectorStore.
func (s *store) Add(obj any) error { return s.update(obj) }

// Update implements cache.ReflectorStore. A pod that turned terminal or lost
// its node is removed here even though the watch selector normally reports
// that as a delete.
func (s *store) Update(obj any) error { return s.update(obj) }

func (s *store) update(obj any) error {
	r, err := recordOf(obj)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.st.put(r)
	s.mu.Unlock()
	return nil
}

// Delete implements cache.ReflectorStore. Unknown UIDs are ignored.
func (s *store) Delete(obj any) error {
	r, err := recordOf(obj)
	if err != nil {
		return err // a tombstone without an object: the next relist fixes it
	}
	k := keyOf(r.uid)
	s.mu.Lock()
	s.st.remove(k)
	s.mu.Unlock()
	return nil
}

// Replace implements cache.ReflectorStore: it rebuilds the index from a full
// list, off the lock, then swaps it in.
func (s *store) Replace(list []any, _ string) error {
	st := newState(len(list))
	skipped := 0
	for _, obj := range list {
		r, err := recordOf(obj)
		if err != nil {
			skipped++
			continue
		}
		st.put(r)
	}
	if skipped > 0 {
		s.log.Warn("podindex: relist contained objects that are not pods", "skipped", skipped)
	}
	s.mu.Lock()
	s.st = st
	s.mu.Unlock()
	if s.synced.CompareAndSwap(false, true) {
		close(s.ready)
	}
	return nil
}

// Resync implements cache.ReflectorStore; there is nothing to resync.
func (s *store) Resync() error { return nil }

// Transformer implements cache.TransformingStore.
func (s *store) Transformer() cache.TransformFunc { return compact }

// indexedPod is what the index holds of one pod.
type indexedPod struct {
	sa       saName
	node     string
	deletion int64 // deletionTimestamp, Unix seconds; 0 if not terminating
}

// pod returns where the pod with this uid runs.
func (s *store) pod(uid string) (indexedPod, bool) {
	k := keyOf(uid)
	s.mu.RLock()
	defer s.mu.RUnlock()
	sl, ok := s.st.pods[k]
	if !ok {
		return indexedPod{}, false
	}
	return indexedPod{sa: s.st.sas.key(sl.sa), node: s.st.nodes.key(sl.node), deletion: s.st.deleting[k]}, true
}

// podNamespace returns the namespace and deletionTimestamp of the pod
// with this uid, without building its node name.
func (s *store) podNamespace(uid string) (namespace string, deletion int64, ok bool) {
	k := keyOf(uid)
	s.mu.RLock()
	defer s.mu.RUnlock()
	sl, ok := s.st.pods[k]
	if !ok {
		return "", 0, false
	}
	return s.st.sas.key(sl.sa).namespace, s.st.deleting[k], true
}

// onNode reports whether sa has a pod on node that is not terminating, or
// has been terminating since cutoff (Unix seconds) or later.
func (s *store) onNode(node string, sa saName, cutoff int64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n, ok := s.st.nodes.lookup(node)
	if !ok {
		return false
	}
	a, ok := s.st.sas.lookup(sa)
	return ok && s.st.running(n, a, cutoff)
}

func (s *store) stats() Stats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return Stats{Pods: len(s.st.pods), Nodes: s.st.nodes.len(), ServiceAccounts: s.st.sas.len()}
}
