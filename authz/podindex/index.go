package podindex

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"

	"github.com/workload-ca/workload-ca/authz"
)

// liveScheduledPods selects the pods the index holds. Pods that finish or
// are deleted leave the selection and arrive as watch deletes.
const liveScheduledPods = "spec.nodeName!=,status.phase!=Failed,status.phase!=Succeeded"

// Defaults for Config.
const (
	DefaultLookupRate    = rate.Limit(20)
	DefaultLookupBurst   = 40
	DefaultLookupTimeout = 2 * time.Second
	// One caller (a node, for the lookups a node agent's requests make; a
	// namespace, for a caller's own pod) gets a share of the live lookups.
	DefaultLookupRatePerCaller  = rate.Limit(1)
	DefaultLookupBurstPerCaller = 4
	// lookupCallers is how many callers' budgets are remembered; the least
	// recently seen is forgotten first.
	lookupCallers = 16384
)

// Config configures an Index. Client is required; zero values of the other
// fields take the defaults.
type Config struct {
	Client kubernetes.Interface
	// Clock drives the live-lookup rate limiter.
	Clock  clock.PassiveClock
	Logger *slog.Logger
	// LookupRate and LookupBurst bound the live API lookups made on index
	// misses, across all callers.
	LookupRate  rate.Limit
	LookupBurst int
	// LookupRatePerCaller and LookupBurstPerCaller bound those of one
	// caller, so that one node agent's misses cannot take every lookup.
	LookupRatePerCaller  rate.Limit
	LookupBurstPerCaller int
	// LookupTimeout bounds one live lookup.
	LookupTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.LookupRate == 0 {
		c.LookupRate = DefaultLookupRate
	}
	if c.LookupBurst == 0 {
		c.LookupBurst = DefaultLookupBurst
	}
	if c.LookupTimeout == 0 {
		c.LookupTimeout = DefaultLookupTimeout
	}
	if c.LookupRatePerCaller == 0 {
		c.LookupRatePerCaller = DefaultLookupRatePerCaller
	}
	if c.LookupBurstPerCaller == 0 {
		c.LookupBurstPerCaller = DefaultLookupBurstPerCaller
	}
	return c
}

// Index answers authz.Pods from a compact in-memory index of live, scheduled
// pods, with a bounded live lookup on a miss. It is safe for concurrent use.
type Index struct {
	cfg     Config
	store   *store
	limiter *rate.Limiter
	callers *lru.Cache    // caller key -> *rate.Limiter
	logOnce *rate.Limiter // at most one refusal log line a second
	started atomic.Bool
	lookups atomic.Uint64 // live lookups made
	refused atomic.Uint64 // live lookups refused by the limiter
}

var _ authz.Pods = (*Index)(nil)

// Stats is the size of the index and the live lookups made so far, for
// metrics.
type Stats struct {
	Pods            int
	Nodes           int
	ServiceAccounts int
	Lookups         uint64 // live API lookups made on index misses
	LookupsRefused  uint64 // misses refused (as overload) by a lookup budget
}

// New returns an empty Index; Run fills it. It panics if cfg.Client is nil.
func New(cfg Config) *Index {
	if cfg.Client == nil {
		panic("podindex: Config.Client is required")
	}
	cfg = cfg.withDefaults()
	return &Index{
		cfg:     cfg,
		store:   newStore(cfg.Logger),
		limiter: rate.NewLimiter(cfg.LookupRate, cfg.LookupBurst),
		callers: lru.New(lookupCallers),
		logOnce: rate.NewLimiter(rate.Every(time.Second), 1),
	}
}

// Run lists and watches pods into the index until ctx ends, then returns nil.
// List and watch failures are retried with backoff (and logged); until the
// first list succeeds HasSynced stays false. Run may be called once.
func (i *Index) Run(ctx context.Context) error {
	if !i.started.CompareAndSwap(false, true) {
		return errors.New("podindex: Run called more than once")
	}
	logger := logr.FromSlogHandler(i.cfg.Logger.Handler())
	r := cache.NewReflectorWithOptions(i.listWatcher(), &corev1.Pod{}, i.store, cache.ReflectorOptions{
		Name:   "podindex",
		Logger: &logger,
	})
	r.RunWithContext(logr.NewContext(ctx, logger))
	return nil
}

// listWatcher lists and watches live scheduled pods in all namespaces. Lists
// are cut down to podRefs page by page (see compactList); watch events are
// reduced by the store as they arrive.
func (i *Index) listWatcher() cache.ListerWatcher {
	pods := i.cfg.Client.CoreV1().Pods(metav1.NamespaceAll)
	list := func(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
		opts.FieldSelector = liveScheduledPods
		return pods.List(ctx, opts)
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: compactList(list),
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = liveScheduledPods
			return pods.Watch(ctx, opts)
		},
	}
	return cache.ToListWatcherWithWatchListSemantics(lw, i.cfg.Client)
}

// HasSynced reports whether the first full list has been loaded. It stays
// true afterwards, also while the watch is reconnecting.
func (i *Index) HasSynced() bool { return i.store.synced.Load() }

// WaitForSync blocks until HasSynced or ctx ends.
func (i *Index) WaitForSync(ctx context.Context) error {
	select {
	case <-i.store.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("podindex: waiting for pod list: %w", context.Cause(ctx))
	}
}

// Stats returns the number of pods, nodes and service accounts indexed and
// the live lookup counters.
func (i *Index) Stats() Stats {
	st := i.store.stats()
	st.Lookups, st.LookupsRefused = i.lookups.Load(), i.refused.Load()
	return st
}

// IndexedPod reports whether a live pod with this UID in namespace is in
// the index, and its deletionTimestamp (zero unless it is terminating). It
// never calls the API: a pod created moments ago may not be there yet.
func (i *Index) IndexedPod(namespace, uid string) (deletion time.Time, ok bool) {
	ns, unix, ok := i.store.podNamespace(uid)
	if !ok || ns != namespace {
		return time.Time{}, false
	}
	return deletionTime(unix), true
}

// Pod implements authz.Pods. The index is keyed by UID, so on a hit name is
// not compared (a UID names one object); namespace is. On a miss one live GET
// of namespace/name decides.
func (i *Index) Pod(ctx context.Context, namespace, name, uid string) (authz.PodInfo, bool, error) {
	if p, ok := i.store.pod(uid); ok {
		if p.sa.namespace != namespace {
			return authz.PodInfo{}, false, nil // that UID is a pod elsewhere
		}
		return authz.PodInfo{UID: uid, NodeName: p.node, ServiceAccount: p.sa.name, Deletion: deletionTime(p.deletion)}, true, nil
	}
	return i.lookupPod(ctx, namespace, name, uid)
}

// ServiceAccountOnNode implements authz.Pods. On a miss one live, bounded
// LIST of the namespace's pods on node decides. A pod terminating for more
// than authz.DeletionGrace does not count.
func (i *Index) ServiceAccountOnNode(ctx context.Context, node, namespace, serviceAccount string) (bool, error) {
	cutoff := i.cfg.Clock.Now().Add(-authz.DeletionGrace).Unix()
	if i.store.onNode(node, saName{namespace, serviceAccount}, cutoff) {
		return true, nil
	}
	return i.lookupOnNode(ctx, node, namespace, serviceAccount)
}
