package castate

import (
	"bytes"
	"context"
	"errors"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// follower is the state of one Run.
type follower struct {
	s        *SecretStore
	onChange func(State)
	informer cache.Controller
	store    cache.Store
	// mu serializes observe: the informer's handlers and recheck.
	mu sync.Mutex
	// seen is the last KeyState value handled, valid or not.
	seen []byte
}

// Run follows the Secret until ctx ends, then returns nil. For each version
// of the Secret whose state differs from the last one seen, it decodes and
// validates the state; a valid state becomes Current and is passed to
// onChange, an invalid one is logged and ignored, so the previous state
// keeps serving (SetRoots checks it again). onChange is called one call at
// a time, in order, and must not block for long. A deleted Secret is
// re-created from the last valid state seen (see restore); the last state
// keeps serving either way.
func (s *SecretStore) Run(ctx context.Context, onChange func(State)) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("castate: Run is already running")
	}
	defer s.running.Store(false)
	f := &follower{s: s, onChange: onChange}
	logger := logr.FromSlogHandler(s.log.Handler())
	f.store, f.informer = cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: s.listWatch(),
		ObjectType:    &corev1.Secret{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    f.observe,
			UpdateFunc: func(_, obj any) { f.observe(obj) },
			DeleteFunc: func(any) { s.restore(ctx) },
		},
		Transform: dropManagedFields,
		Logger:    &logger,
	})
	s.follow.Store(f)
	f.informer.RunWithContext(ctx)
	return nil
}

// HasSynced reports whether Run has listed the Secret and handled what it
// found. It is false before Run starts.
func (s *SecretStore) HasSynced() bool {
	f := s.follow.Load()
	return f != nil && f.informer.HasSynced()
}

// recheck handles the Secret as last seen once more, e.g. a state that was
// refused under roots that have changed since.
func (f *follower) recheck() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen = nil
	for _, obj := range f.store.List() {
		f.observeLocked(obj)
	}
}

func (f *follower) observe(obj any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.observeLocked(obj)
}

func (f *follower) observeLocked(obj any) {
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	raw := sec.Data[KeyState]
	if f.seen != nil && bytes.Equal(raw, f.seen) {
		return // another field changed, or a relist
	}
	f.seen = bytes.Clone(raw)
	st, err := f.s.decode(sec.Data)
	if err != nil {
		f.s.log.Error("ignoring an invalid CA state in the Secret; the previous state keeps serving",
			"resourceVersion", sec.ResourceVersion, "error", err)
		return
	}
	f.s.current.Store(&st)
	f.s.log.Info("CA state changed", "resourceVersion", sec.ResourceVersion, "phase", st.Phase(),
		"authorities", len(st.Authorities))
	if f.onChange != nil {
		f.onChange(st)
	}
}

// listWatch lists and watches the one Secret, by name: a field selector on
// metadata.name, in the namespace.
func (s *SecretStore) listWatch() cache.ListerWatcher {
	selector := fields.OneTermEqualSelector("metadata.name", s.name).String()
	secrets := s.client.CoreV1().Secrets(s.ns)
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return secrets.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return secrets.Watch(ctx, o)
		},
	}, s.client)
}

// dropManagedFields is the informer's transform. It is idempotent.
func dropManagedFields(obj any) (any, error) {
	if sec, ok := obj.(*corev1.Secret); ok {
		sec.ManagedFields = nil
	}
	return obj, nil
}
