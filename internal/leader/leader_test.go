package leader

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"

	"github.com/workload-ca/workload-ca/internal/testwait"
)

// slowTask records how many of its runs overlap and, when its context
// ends, takes a while to stop, reading who holds the Lease meanwhile.
type slowTask struct {
	mu          sync.Mutex
	running     int
	overlapped  bool
	starts      int
	holderAtEnd []string // the Lease's holder while each run was stopping
	holder      func() string
	stopping    chan struct{} // receives when a run starts stopping
}

func (s *slowTask) run(ctx context.Context) error {
	s.mu.Lock()
	s.running++
	s.starts++
	s.overlapped = s.overlapped || s.running > 1
	s.mu.Unlock()
	<-ctx.Done()
	select {
	case s.stopping <- struct{}{}:
	default:
	}
	time.Sleep(time.Second) // finishing a write
	h := s.holder()
	s.mu.Lock()
	s.running--
	s.holderAtEnd = append(s.holderAtEnd, h)
	s.mu.Unlock()
	return nil
}

func (s *slowTask) count() (starts int, ends []string, overlapped bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts, append([]string(nil), s.holderAtEnd...), s.overlapped
}

// The lease is held until the leader's tasks have returned, on shutdown
// (then released) and after a lost lease (no second run of a task starts
// while the first still stops).
func TestLeaderHoldsLeaseUntilTasksStop(t *testing.T) {
	client := fake.NewClientset()
	// While failing, the API server refuses renewals but lets a release (a
	// record without a holder) through: it was slow, then recovered.
	var failing atomic.Bool
	client.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		lease := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if failing.Load() && ptr.Deref(lease.Spec.HolderIdentity, "") != "" {
			return true, nil, errors.New("the API server is unavailable")
		}
		return false, nil, nil
	})
	leases := client.CoordinationV1().Leases("ns")
	holder := func() string {
		l, err := leases.Get(context.Background(), "wca", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	task := &slowTask{holder: holder, stopping: make(chan struct{}, 1)}
	l := New(Config{Client: client, Namespace: "ns", Name: "wca", Durations: Durations{Lease: time.Second, Renew: 500 * time.Millisecond, Retry: 100 * time.Millisecond},
		Logger: slog.New(slog.DiscardHandler), Tasks: []Task{{Name: "slow", Run: task.run}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	testwait.Eventually(t, "leading", func() bool { s, _, _ := task.count(); return s == 1 })

	t.Run("a lost lease: the next run waits for the last", func(t *testing.T) {
		// Renewals fail until the leader gives up and its task starts
		// stopping; then the API server is back: the release must wait
		// for the task, and a new campaign could lead at once.
		failing.Store(true)
		select {
		case <-task.stopping:
		case <-time.After(10 * time.Second):
			t.Fatal("the task was not stopped after the lease was lost")
		}
		failing.Store(false)
		testwait.Eventually(t, "leading again", func() bool { s, _, _ := task.count(); return s == 2 })
		_, ends, overlapped := task.count()
		if overlapped {
			t.Error("the task ran twice at once")
		}
		if len(ends) != 1 || ends[0] != l.identity {
			t.Errorf("holder while the lost lease's task stopped: %q, want this replica (released only after)", ends)
		}
	})
	t.Run("shutdown: the lease is released after the tasks stop", func(t *testing.T) {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return")
		}
		_, ends, _ := task.count()
		if len(ends) != 2 || ends[1] != l.identity {
			t.Errorf("holders while the runs stopped: %q; want this replica while the last stopped", ends)
		}
		if h := holder(); h != "" {
			t.Errorf("after Run: held by %q, want released", h)
		}
	})
}

// recordLock is a resourcelock.Interface over one record, counting writes.
type recordLock struct {
	resourcelock.Interface // unused methods panic
	identity               string
	rec                    resourcelock.LeaderElectionRecord
	writes                 int
}

func (l *recordLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r := l.rec
	return &r, nil, nil
}

func (l *recordLock) Update(_ context.Context, rec resourcelock.LeaderElectionRecord) error {
	l.rec = rec
	l.writes++
	return nil
}

func (l *recordLock) Identity() string { return l.identity }

// A release waits for the tasks, and is not written when the lease has
// passed to another replica meanwhile (the tasks took longer than the
// lease): writing it would free that replica's lease.
func TestReleaseAfterTasks(t *testing.T) {
	for _, tt := range []struct {
		name, holder string
		wantWrite    bool
	}{
		{name: "still ours", holder: "a", wantWrite: true},
		{name: "taken by b meanwhile", holder: "b", wantWrite: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lock := &recordLock{identity: "a"}
			stopped := false
			wrapped := releaseAfter{Interface: lock, stop: func() { stopped = true; lock.rec.HolderIdentity = tt.holder }}
			if err := wrapped.Update(context.Background(), resourcelock.LeaderElectionRecord{HolderIdentity: "a"}); err != nil || stopped {
				t.Fatalf("renewal: %v, tasks stopped %v; want written, tasks untouched", err, stopped)
			}
			err := wrapped.Update(context.Background(), resourcelock.LeaderElectionRecord{})
			if !stopped {
				t.Fatal("released without stopping the tasks")
			}
			if got := lock.writes == 2; got != tt.wantWrite || (err == nil) != tt.wantWrite {
				t.Fatalf("release written %v (err %v), want %v", got, err, tt.wantWrite)
			}
			if !tt.wantWrite && lock.rec.HolderIdentity != "b" {
				t.Fatalf("b's lease became %+v", lock.rec)
			}
		})
	}
}
