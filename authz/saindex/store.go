package saindex

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// name is a service account's namespace and name.
type name struct{ namespace, name string }

// entry is what the index keeps of one service account.
type entry struct {
	uid      string
	deletion int64 // deletionTimestamp in Unix seconds, 0 if none
}

// store is the cache.ReflectorStore the reflector feeds; it keeps an entry
// per service account and no objects.
type store struct {
	mu     sync.RWMutex
	byName map[name]entry
	synced atomic.Bool
	ready  chan struct{} // closed by the first Replace
}

var _ cache.TransformingStore = (*store)(nil)

func newStore() *store {
	return &store{byName: map[name]entry{}, ready: make(chan struct{})}
}

// account is a service account cut down to what the index reads, for the
// reflector's initial list, which holds every object at once.
type account struct{ metav1.ObjectMeta }

func (a *account) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies a; the reflector never changes what it stores.
func (a *account) DeepCopyObject() runtime.Object {
	c := *a
	return &c
}

// Transformer implements cache.TransformingStore.
func (s *store) Transformer() cache.TransformFunc {
	return func(obj any) (any, error) {
		if sa, ok := obj.(*corev1.ServiceAccount); ok {
			return &account{metav1.ObjectMeta{Namespace: sa.Namespace, Name: sa.Name, UID: sa.UID,
				DeletionTimestamp: sa.DeletionTimestamp}}, nil
		}
		return obj, nil
	}
}

func keyAndEntry(obj any) (name, entry, error) {
	var m *metav1.ObjectMeta
	switch o := obj.(type) {
	case *corev1.ServiceAccount:
		m = &o.ObjectMeta
	case *account:
		m = &o.ObjectMeta
	case cache.DeletedFinalStateUnknown:
		if o.Obj == nil {
			return name{}, entry{}, fmt.Errorf("saindex: tombstone %q without an object", o.Key)
		}
		return keyAndEntry(o.Obj)
	default:
		return name{}, entry{}, fmt.Errorf("saindex: unexpected object %T", obj)
	}
	e := entry{uid: strings.Clone(string(m.UID))}
	if m.DeletionTimestamp != nil {
		e.deletion = m.DeletionTimestamp.Unix()
	}
	return name{strings.Clone(m.Namespace), strings.Clone(m.Name)}, e, nil
}

// Add implements cache.ReflectorStore.
func (s *store) Add(obj any) error { return s.put(obj) }

// Update implements cache.ReflectorStore.
func (s *store) Update(obj any) error { return s.put(obj) }

func (s *store) put(obj any) error {
	k, e, err := keyAndEntry(obj)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.byName[k] = e
	s.mu.Unlock()
	return nil
}

// Delete implements cache.ReflectorStore. A delete of another UID under
// the same name (a watch event that arrives after the name was reused) is
// ignored.
func (s *store) Delete(obj any) error {
	k, e, err := keyAndEntry(obj)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if cur, ok := s.byName[k]; ok && cur.uid == e.uid {
		delete(s.byName, k)
	}
	s.mu.Unlock()
	return nil
}

// Replace implements cache.ReflectorStore: it rebuilds the index from a
// full list and swaps it in.
func (s *store) Replace(list []any, _ string) error {
	byName := make(map[name]entry, len(list))
	for _, obj := range list {
		k, e, err := keyAndEntry(obj)
		if err != nil {
			continue
		}
		byName[k] = e
	}
	s.mu.Lock()
	s.byName = byName
	s.mu.Unlock()
	if s.synced.CompareAndSwap(false, true) {
		close(s.ready)
	}
	return nil
}

// Resync implements cache.ReflectorStore; there is nothing to resync.
func (s *store) Resync() error { return nil }

// get returns the UID and deletionTimestamp of namespace/n.
func (s *store) get(namespace, n string) (string, time.Time, bool) {
	s.mu.RLock()
	e, ok := s.byName[name{namespace, n}]
	s.mu.RUnlock()
	if !ok {
		return "", time.Time{}, false
	}
	var deletion time.Time
	if e.deletion != 0 {
		deletion = time.Unix(e.deletion, 0)
	}
	return e.uid, deletion, true
}

func (s *store) len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.byName)
}
