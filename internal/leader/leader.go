package leader

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Task is work only the leader does (publishing trust bundles, driving
// rotation). It runs until ctx ends; an error restarts it after a backoff
// while this replica still leads.
type Task struct {
	Name string
	Run  func(ctx context.Context) error
}

// Durations are the Lease's timings, as client-go's leader election takes
// them.
type Durations struct{ Lease, Renew, Retry time.Duration }

// Config configures an Elector.
type Config struct {
	// Client writes the Lease Namespace/Name.
	Client          kubernetes.Interface
	Namespace, Name string
	Durations       Durations
	Tasks           []Task
	Logger          *slog.Logger
	// OnChange, if set, is told when this replica starts or stops leading.
	OnChange func(leading bool)
	// Identity names this replica in the Lease (default: the host name
	// and a random suffix).
	Identity string
}

// Elector runs the writers under a Lease so that, of several replicas,
// one writes at a time while every replica keeps serving certificates.
type Elector struct {
	client    kubernetes.Interface
	namespace string
	name      string
	identity  string
	tasks     []Task
	log       *slog.Logger
	durations Durations
	onChange  func(leading bool)
}

// New returns an Elector; nothing is written until Run.
func New(cfg Config) *Elector {
	if cfg.Identity == "" {
		host, _ := os.Hostname()
		cfg.Identity = host + "_" + rand.String(8)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Elector{client: cfg.Client, namespace: cfg.Namespace, name: cfg.Name, identity: cfg.Identity,
		tasks: cfg.Tasks, log: cfg.Logger, durations: cfg.Durations, onChange: cfg.OnChange}
}

// Run campaigns until ctx ends, campaigning again after losing the lease.
func (l *Elector) Run(ctx context.Context) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: l.namespace, Name: l.name},
		Client:     l.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: l.identity},
	}
	for ctx.Err() == nil {
		if err := l.campaign(ctx, lock); err != nil {
			return err
		}
	}
	return nil
}

// campaign runs one leader election until this replica has stopped leading
// and its tasks have returned, or ctx has ended.
//
// client-go runs OnStartedLeading in a goroutine it does not wait for and,
// with ReleaseOnCancel, releases the lease as soon as this replica stops
// leading (shut down, or a renewal missed its deadline), before it cancels
// the tasks' context: another replica could then lead while this one's
// tasks still write. So the elector's lock holds the release until the
// tasks have returned (releaseAfter), and the next campaign waits for them
// too (a lost lease is not always released).
func (l *Elector) campaign(ctx context.Context, lock resourcelock.Interface) error {
	var (
		mu          sync.Mutex
		stopping    bool
		cancelTasks context.CancelFunc = func() {}
		tasksDone   chan struct{}      // set when leading begins, closed when the tasks have returned
	)
	stopTasks := func() {
		mu.Lock()
		stopping = true
		cancel, done := cancelTasks, tasksDone
		mu.Unlock()
		cancel()
		if done != nil {
			<-done
		}
	}
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: releaseAfter{Interface: lock, stop: stopTasks}, Name: l.name, ReleaseOnCancel: true,
		LeaseDuration: l.durations.Lease, RenewDeadline: l.durations.Renew, RetryPeriod: l.durations.Retry,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leading context.Context) {
				tasks, cancel := context.WithCancel(leading)
				defer cancel()
				mu.Lock()
				if stopping {
					mu.Unlock()
					return
				}
				done := make(chan struct{})
				cancelTasks, tasksDone = cancel, done
				mu.Unlock()
				defer close(done)
				l.lead(tasks)
			},
			OnStoppedLeading: func() { l.setLeading(false); l.log.Info("stopped leading") },
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	elector.Run(ctx)
	stopTasks()
	return nil
}

// releaseAfter is the elector's lock: client-go releases the lease by
// writing a record without a holder, and that write waits for stop (which
// stops the leader's tasks and waits for them).
type releaseAfter struct {
	resourcelock.Interface
	stop func()
}

// releaseTimeout bounds a release once the tasks have stopped.
const releaseTimeout = 10 * time.Second

func (l releaseAfter) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	if rec.HolderIdentity != "" {
		return l.Interface.Update(ctx, rec)
	}
	l.stop()
	// The tasks may have taken long enough for client-go's deadline to
	// pass and for the lease to expire and pass to another replica: the
	// release gets a deadline of its own and goes ahead only if the lease,
	// read again now, is still ours (the read also refreshes the version
	// the write is conditional on, so a change after it conflicts).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	cur, _, err := l.Get(ctx)
	if err != nil {
		return fmt.Errorf("reading the lease before releasing it: %w", err)
	}
	if cur.HolderIdentity != l.Identity() {
		return fmt.Errorf("not releasing the lease: %q holds it now", cur.HolderIdentity)
	}
	return l.Interface.Update(ctx, rec)
}

// lead runs every task until leadership ends.
func (l *Elector) lead(ctx context.Context) {
	l.setLeading(true)
	l.log.Info("started leading", "identity", l.identity)
	g, ctx := errgroup.WithContext(ctx)
	for _, t := range l.tasks {
		g.Go(func() error {
			backoff := wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.2, Steps: 8, Cap: time.Minute}
			for ctx.Err() == nil {
				err := t.Run(ctx)
				if ctx.Err() != nil {
					return nil
				}
				d := backoff.Step()
				l.log.Error("leader task failed; retrying", "task", t.Name, "error", fmt.Sprint(err), "retry_in", d)
				select {
				case <-ctx.Done():
				case <-time.After(d):
				}
			}
			return nil
		})
	}
	_ = g.Wait()
}

func (l *Elector) setLeading(v bool) {
	if l.onChange != nil {
		l.onChange(v)
	}
}
