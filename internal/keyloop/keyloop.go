// Package keyloop runs the loop of a keyed controller, as Kubernetes'
// controllers do: start the informers and wait for their caches, reconcile
// every key once and again on each resync, and otherwise reconcile the keys
// the informers' event handlers put on the queue, one at a time, retrying
// failures with the queue's backoff.
package keyloop

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
)

// Loop is one run of a controller. Every field is required.
type Loop struct {
	// Queue holds the keys to reconcile; the informers' handlers add to it.
	// Run shuts it down when it returns.
	Queue     workqueue.TypedRateLimitingInterface[string]
	Informers []cache.Controller
	// Keys lists every key: reconciled once the caches have synced and
	// again every Resync.
	Keys func() []string
	// Reconcile converges one key. An error retries the key with the
	// queue's backoff; nil forgets its earlier failures. It is not called
	// concurrently.
	Reconcile func(ctx context.Context, key string) error
	Clock     clock.WithTicker
	Resync    time.Duration
}

// Run runs the informers, then reconciles until ctx ends; it returns once
// the informers and the worker have stopped.
func (l *Loop) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	defer l.Queue.ShutDown() // runs before wg.Wait: stops the worker
	synced := make([]cache.InformerSynced, 0, len(l.Informers))
	for _, inf := range l.Informers {
		wg.Go(func() { inf.RunWithContext(ctx) })
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return
	}
	l.enqueueAll()
	wg.Go(func() { l.resyncLoop(ctx) })
	wg.Go(func() {
		for l.processNext(ctx) {
		}
	})
	<-ctx.Done()
}

func (l *Loop) enqueueAll() {
	for _, k := range l.Keys() {
		l.Queue.Add(k)
	}
}

func (l *Loop) resyncLoop(ctx context.Context) {
	t := l.Clock.NewTicker(l.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			l.enqueueAll()
		}
	}
}

// processNext reconciles one key; it returns false when the queue is shut
// down.
func (l *Loop) processNext(ctx context.Context) bool {
	key, quit := l.Queue.Get()
	if quit {
		return false
	}
	defer l.Queue.Done(key)
	switch err := l.Reconcile(ctx, key); {
	case ctx.Err() != nil: // shutting down: no retry
	case err != nil:
		l.Queue.AddRateLimited(key)
	default:
		l.Queue.Forget(key)
	}
	return true
}
