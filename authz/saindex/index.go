package saindex

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Config configures an Index. Client is required.
type Config struct {
	Client kubernetes.Interface
	Logger *slog.Logger
}

// Index answers which UID a service account has, from a watch of every
// service account. It is safe for concurrent use.
type Index struct {
	cfg     Config
	store   *store
	started atomic.Bool
}

// New returns an empty Index; Run fills it.
func New(cfg Config) (*Index, error) {
	if cfg.Client == nil {
		return nil, errors.New("saindex: Config.Client is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Index{cfg: cfg, store: newStore()}, nil
}

// Run lists and watches service accounts into the index until ctx ends,
// then returns nil. Failures are retried with backoff; until the first
// list succeeds HasSynced stays false. Run may be called once.
func (i *Index) Run(ctx context.Context) error {
	if !i.started.CompareAndSwap(false, true) {
		return errors.New("saindex: Run called more than once")
	}
	logger := logr.FromSlogHandler(i.cfg.Logger.Handler())
	accounts := i.cfg.Client.CoreV1().ServiceAccounts(metav1.NamespaceAll)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return accounts.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return accounts.Watch(ctx, opts)
		},
	}
	r := cache.NewReflectorWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, i.cfg.Client),
		&corev1.ServiceAccount{}, i.store, cache.ReflectorOptions{Name: "saindex", Logger: &logger})
	r.RunWithContext(logr.NewContext(ctx, logger))
	return nil
}

// HasSynced reports whether the first full list has been loaded.
func (i *Index) HasSynced() bool { return i.store.synced.Load() }

// WaitForSync blocks until HasSynced or ctx ends.
func (i *Index) WaitForSync(ctx context.Context) error {
	select {
	case <-i.store.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("saindex: waiting for the service account list: %w", context.Cause(ctx))
	}
}

// ServiceAccount returns the UID of namespace/name and its
// deletionTimestamp (zero unless it is being deleted); ok is false when
// the index holds no such service account.
func (i *Index) ServiceAccount(namespace, name string) (uid string, deletion time.Time, ok bool) {
	return i.store.get(namespace, name)
}

// Len is the number of service accounts indexed.
func (i *Index) Len() int { return i.store.len() }
