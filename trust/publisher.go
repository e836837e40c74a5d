package trust

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/internal/keyloop"
)

// ErrRequeue marks a reconcile that lost a race with another writer: the
// object changed between the cache read and our write. It is retried with
// backoff like an error, but is not one: it is logged at debug level.
var ErrRequeue = errors.New("changed meanwhile")

// Kind names what a publisher publishes, in its logs.
type Kind struct {
	// Name is the object kind ("ClusterTrustBundle").
	Name string
	// Key is the log attribute of a queue key ("signer", "namespace").
	Key string
}

// Target is one run of a publisher: the informers that fill its queue,
// every key, and how one key converges.
type Target interface {
	// Queue is the run's workqueue (NewQueue), which its informers' handlers
	// add to.
	Queue() workqueue.TypedRateLimitingInterface[string]
	Informers() []cache.Controller
	// Keys lists every key: reconciled when the caches have synced and
	// every resync period.
	Keys() []string
	// Reconcile converges one key and says how (a Result* value).
	Reconcile(ctx context.Context, key string) (string, error)
}

// ListWatch lists and watches with fieldSelector ("" for everything), for
// a target's informers. client tells the reflector whether watch-list
// streaming works (not with the fake clientset).
func ListWatch(client kubernetes.Interface, fieldSelector string,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
) cache.ListerWatcher {
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = fieldSelector
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = fieldSelector
			return watchFn(ctx, o)
		},
	}, client)
}

// DropManagedFields is the targets' informer transform: managed fields are
// never read and are a large part of every object. It is idempotent, as
// informers require.
func DropManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil // e.g. cache.DeletedFinalStateUnknown
}

// NewQueue returns the workqueue of one run, with the controllers' usual
// backoff on clk.
func NewQueue(clk clock.WithTicker) workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Clock: clk})
}

// Publisher runs one Target at a time, on the leader: Run starts a run and
// Trigger reconciles every key of the current one.
type Publisher struct {
	kind    Kind
	opts    Options
	running atomic.Bool
	active  keyloop.Current
}

// NewPublisher returns the shell of a publisher of kind with opts, whose
// defaults the caller has applied (Options.WithDefaults).
func NewPublisher(kind Kind, opts Options) *Publisher {
	return &Publisher{kind: kind, opts: opts}
}

// Run calls start (the run's checks, such as discovery and permissions,
// and its Target), returns its error without retrying, and otherwise
// reconciles until ctx ends, then returns nil. Failed reconciles are
// logged, reported to the Observer and retried with backoff. Run may be
// called again after it returns, never twice at once.
func (p *Publisher) Run(ctx context.Context, start func(context.Context) (Target, error)) error {
	if !p.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%s publisher: Run is already running", p.kind.Name)
	}
	defer p.running.Store(false)
	t, err := start(ctx)
	if err != nil {
		return err
	}
	p.active.Run(ctx, &keyloop.Loop{Queue: t.Queue(), Informers: t.Informers(), Keys: t.Keys,
		Reconcile: func(ctx context.Context, key string) error { return p.sync(ctx, t, key) },
		Clock:     p.opts.Clock, Resync: p.opts.ResyncPeriod})
	return nil
}

// Trigger asks for a reconcile of every key, e.g. after the roots changed.
// It does not block, and does nothing unless Run is running (Run
// reconciles everything when it starts).
func (p *Publisher) Trigger() { p.active.EnqueueAll() }

// sync reconciles one key, reports the result, and logs a failure (which
// the loop retries with backoff).
func (p *Publisher) sync(ctx context.Context, t Target, key string) error {
	result, err := t.Reconcile(ctx, key)
	if ctx.Err() != nil {
		return nil // shutting down: neither a result nor a retry
	}
	p.opts.Observer.Published(result)
	switch {
	case errors.Is(err, ErrRequeue):
		p.opts.Logger.DebugContext(ctx, p.kind.Name+" changed while publishing, will retry",
			p.kind.Key, key, "error", err)
	case err != nil:
		p.opts.Logger.ErrorContext(ctx, "publishing "+p.kind.Name+" failed, will retry",
			p.kind.Key, key, "retries", t.Queue().NumRequeues(key), "error", err)
	}
	return err
}
