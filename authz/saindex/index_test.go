package saindex

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/workload-ca/workload-ca/internal/testwait"
)

func sa(ns, n, uid string) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n, UID: types.UID(uid)}}
}

func deleting(a *corev1.ServiceAccount, at time.Time) *corev1.ServiceAccount {
	a = a.DeepCopy()
	ts := metav1.NewTime(at)
	a.DeletionTimestamp = &ts
	return a
}

func TestStore(t *testing.T) {
	at := time.Unix(1_900_000_000, 0)
	type want struct {
		uid      string
		deletion time.Time
		ok       bool
	}
	tests := []struct {
		name string
		ops  func(s *store) error
		want want
	}{
		{name: "added", ops: func(s *store) error { return s.Add(sa("apps", "web", "u1")) },
			want: want{uid: "u1", ok: true}},
		{name: "re-created under its name: the new UID", ops: func(s *store) error {
			return errorsOf(s.Add(sa("apps", "web", "u1")), s.Delete(sa("apps", "web", "u1")), s.Add(sa("apps", "web", "u2")))
		}, want: want{uid: "u2", ok: true}},
		{name: "a late delete of the old UID keeps the new one", ops: func(s *store) error {
			return errorsOf(s.Add(sa("apps", "web", "u2")), s.Delete(sa("apps", "web", "u1")))
		}, want: want{uid: "u2", ok: true}},
		{name: "deleted", ops: func(s *store) error {
			return errorsOf(s.Add(sa("apps", "web", "u1")), s.Delete(sa("apps", "web", "u1")))
		}},
		{name: "deleted through a tombstone", ops: func(s *store) error {
			return errorsOf(s.Add(sa("apps", "web", "u1")),
				s.Delete(cache.DeletedFinalStateUnknown{Key: "apps/web", Obj: sa("apps", "web", "u1")}))
		}},
		{name: "being deleted", ops: func(s *store) error {
			return errorsOf(s.Add(sa("apps", "web", "u1")), s.Update(deleting(sa("apps", "web", "u1"), at)))
		}, want: want{uid: "u1", deletion: at, ok: true}},
		{name: "replaced by a list without it", ops: func(s *store) error {
			return errorsOf(s.Add(sa("apps", "web", "u1")), s.Replace([]any{sa("apps", "db", "u3")}, "1"))
		}},
		{name: "replaced by a list of transformed objects", ops: func(s *store) error {
			obj, err := s.Transformer()(deleting(sa("apps", "web", "u1"), at))
			return errorsOf(err, s.Replace([]any{obj}, "1"))
		}, want: want{uid: "u1", deletion: at, ok: true}},
		{name: "another namespace is another account", ops: func(s *store) error {
			return s.Add(sa("shop", "web", "u9"))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore()
			if err := tc.ops(s); err != nil {
				t.Fatal(err)
			}
			uid, deletion, ok := s.get("apps", "web")
			if got := (want{uid, deletion, ok}); !got.deletion.Equal(tc.want.deletion) || got.uid != tc.want.uid || got.ok != tc.want.ok {
				t.Errorf("get(apps/web) = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestStoreRefusesOtherObjects(t *testing.T) {
	s := newStore()
	if err := s.Add(&corev1.Pod{}); err == nil {
		t.Error("Add(pod) = nil, want an error")
	}
	if err := s.Delete(cache.DeletedFinalStateUnknown{Key: "apps/web"}); err == nil {
		t.Error("Delete(empty tombstone) = nil, want an error")
	}
}

func errorsOf(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// TestRun drives Run against the fake clientset: the initial list, then
// watch events for an account deleted and created again under its name.
func TestRun(t *testing.T) {
	client := fake.NewClientset(sa("apps", "web", "u1"))
	watching := make(chan struct{})
	var once sync.Once
	client.PrependWatchReactor("serviceaccounts", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		once.Do(func() { close(watching) })
		return true, w, err
	})
	idx, err := New(Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	if idx.HasSynced() {
		t.Fatal("synced before Run")
	}
	stop := testwait.Run(t, idx.Run)
	defer stop()
	ctx, cancel := context.WithTimeout(t.Context(), testwait.Timeout)
	defer cancel()
	if err := idx.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	<-watching
	if uid, _, ok := idx.ServiceAccount("apps", "web"); !ok || uid != "u1" {
		t.Fatalf("after sync: ServiceAccount(apps/web) = %q, %v; want u1", uid, ok)
	}
	accounts := client.CoreV1().ServiceAccounts("apps")
	if err := accounts.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "deleted account gone", func() bool { _, _, ok := idx.ServiceAccount("apps", "web"); return !ok })
	if _, err := accounts.Create(ctx, sa("apps", "web", "u2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "re-created account has its new UID", func() bool {
		uid, _, _ := idx.ServiceAccount("apps", "web")
		return uid == "u2"
	})
	if idx.Len() != 1 {
		t.Errorf("Len() = %d, want 1", idx.Len())
	}
	stop()
	if err := idx.Run(context.Background()); err == nil {
		t.Error("second Run returned nil, want an error")
	}
}
