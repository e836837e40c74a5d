package podindex

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/workload-ca/workload-ca/internal/testwait"
)

// TestRun drives Run against the fake clientset (list, then watch).
//
// Covered: the initial list through compactList, sync, and watch adds,
// updates and deletes. Not covered: the fake ignores field selectors, so
// terminal and unscheduled pods reach the store and are filtered there (the
// server-side selector, terminal-as-delete, bookmarks and relists after an
// expired resource version are left to the e2e tests against a real
// apiserver); the fake does not support watch-list (see TestWatchList).
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := fake.NewClientset(
		running(uid1, "shop", "checkout", "node-a"),
		testPod(uid2, "shop", "checkout", "node-a", corev1.PodFailed),
		testPod(uid3, "shop", "cart", "", corev1.PodPending),
	)
	watching := make(chan struct{})
	var once sync.Once
	client.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		// Open the tracker watch before signalling, so no event is missed.
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		once.Do(func() { close(watching) })
		return true, w, err
	})
	idx := New(Config{Client: client, Logger: slog.New(slog.DiscardHandler)})
	if idx.HasSynced() {
		t.Fatal("synced before Run")
	}
	errc := make(chan error, 1)
	go func() { errc <- idx.Run(ctx) }()
	if err := idx.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-watching:
	case <-ctx.Done():
		t.Fatal("no watch opened")
	}
	if !idx.HasSynced() || !idx.hasPod(uid1) || idx.hasPod(uid2) || idx.hasPod(uid3) || idx.Stats().Pods != 1 {
		t.Fatalf("after sync: synced=%v has(1,2,3)=%v,%v,%v pods=%d; want only uid1",
			idx.HasSynced(), idx.hasPod(uid1), idx.hasPod(uid2), idx.hasPod(uid3), idx.Stats().Pods)
	}

	pods := client.CoreV1().Pods("shop")
	uid4 := "3e7c0d85-9a4f-4b1d-8c6e-5f8a1b4d0e93"
	if _, err := pods.Create(ctx, running(uid4, "shop", "cart", "node-b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "created pod indexed", func() bool { return idx.store.onNode("node-b", saName{"shop", "cart"}, 0) })

	bound := testPod(uid3, "shop", "cart", "node-c", corev1.PodPending)
	if _, err := pods.Update(ctx, bound, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "bound pod indexed", func() bool { return idx.hasPod(uid3) })

	finished := testPod(uid1, "shop", "checkout", "node-a", corev1.PodSucceeded)
	if _, err := pods.UpdateStatus(ctx, finished, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "finished pod removed", func() bool { return !idx.hasPod(uid1) })

	if err := pods.Delete(ctx, "pod-"+uid4, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "deleted pod removed", func() bool { return !idx.hasPod(uid4) })
	if st := idx.Stats(); st.Pods != 1 || st.Nodes != 1 || st.ServiceAccounts != 1 {
		t.Errorf("stats = %+v, want only uid3 left", st)
	}

	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Run returned %v after cancel, want nil", err)
	}
	if err := idx.Run(context.Background()); err == nil {
		t.Error("second Run returned nil, want error")
	}
}

func TestWaitForSyncHonoursContext(t *testing.T) {
	idx := New(Config{Client: fake.NewClientset(), Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := idx.WaitForSync(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitForSync = %v, want context.Canceled", err)
	}
}

// watchListLW serves the watch-list protocol (initial events streamed on a
// watch, ended by a bookmark) that the fake clientset does not support.
type watchListLW struct {
	w     *watch.FakeWatcher
	used  atomic.Bool
	lists atomic.Int32
}

func (l *watchListLW) List(metav1.ListOptions) (runtime.Object, error) {
	l.lists.Add(1)
	return nil, errors.New("list not expected in watch-list mode")
}

func (l *watchListLW) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	if opts.SendInitialEvents == nil || !*opts.SendInitialEvents || l.used.Swap(true) {
		return watch.NewFake(), nil // never delivers
	}
	return l.w, nil
}

// recordingStore notes what the reflector hands Replace.
type recordingStore struct {
	*store
	mu       sync.Mutex
	replaced []any
}

func (r *recordingStore) Replace(list []any, rv string) error {
	r.mu.Lock()
	r.replaced = append(r.replaced, list...)
	r.mu.Unlock()
	return r.store.Replace(list, rv)
}

// TestWatchList runs a real reflector in watch-list mode (client-go's default
// against a 1.37 apiserver) over the store: the initial events must reach
// Replace already cut down to podRefs by the store's transform.
func TestWatchList(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lw := &watchListLW{w: watch.NewFake()}
	rs := &recordingStore{store: newStore(slog.New(slog.DiscardHandler))}
	r := cache.NewReflectorWithOptions(lw, &corev1.Pod{}, rs, cache.ReflectorOptions{Name: "test"})
	go r.RunWithContext(ctx)

	full := running(uid1, "shop", "checkout", "node-a")
	full.ResourceVersion, full.ManagedFields = "5", []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	lw.w.Add(full)
	lw.w.Add(testPod(uid2, "shop", "cart", "node-b", corev1.PodFailed))
	lw.w.Action(watch.Bookmark, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		ResourceVersion: "6",
		Annotations:     map[string]string{metav1.InitialEventsAnnotationKey: "true"},
	}})
	select {
	case <-rs.ready:
	case <-ctx.Done():
		t.Fatal("watch-list sync timed out")
	}
	if n := lw.lists.Load(); n != 0 {
		t.Fatalf("reflector fell back to %d list calls; watch-list not exercised", n)
	}
	rs.mu.Lock()
	for _, obj := range rs.replaced {
		if _, ok := obj.(*podRef); !ok {
			t.Errorf("Replace got %T, want *podRef", obj)
		}
	}
	rs.mu.Unlock()
	if !rs.has(uid1) || rs.has(uid2) {
		t.Errorf("after watch-list sync: has(uid1)=%v has(uid2)=%v; want true, false", rs.has(uid1), rs.has(uid2))
	}
	lw.w.Delete(full)
	testwait.Eventually(t, "deleted pod removed", func() bool { return !rs.has(uid1) })
}
