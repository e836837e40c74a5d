// Package keyloop runs the loop of a keyed controller, as Kubernetes'
// controllers do: start the informers and wait for their caches, reconcile
// every key once and again on each resync, and otherwise reconcile the keys
// the informers' event handlers put on the queue with one worker or more
// (never two at once for one key), retrying failures with the queue's
// backoff.
package keyloop

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
)

// Loop is one run of a controller. Every field but Workers is required.
type Loop struct {
	// Queue holds the keys to reconcile; the informers' handlers add to it.
	// Run shuts it down when it returns.
	Queue     workqueue.TypedRateLimitingInterface[string]
	Informers []cache.Controller
	// Keys lists every key: reconciled once the caches have synced and
	// again every Resync.
	Keys func() []string
	// Reconcile converges one key. An error retries the key with the
	// queue's backoff; nil forgets its earlier failures. It is called
	// concurrently for different keys when Workers is above one, never for
	// one key: the queue hands a key out again only once it is done.
	Reconcile func(ctx context.Context, key string) error
	Clock     clock.WithTicker
	Resync    time.Duration
	// Workers is how many keys are reconciled at once (default 1).
	Workers int
}

// Run runs the informers, then reconciles until ctx ends; it returns once
// the informers and the worker have stopped.
func (l *Loop) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	defer l.Queue.ShutDown() // runs before wg.Wait: stops the workers
	synced := make([]cache.InformerSynced, 0, len(l.Informers))
	for _, inf := range l.Informers {
		wg.Go(func() { inf.RunWithContext(ctx) })
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return
	}
	l.EnqueueAll()
	wg.Go(func() { l.resyncLoop(ctx) })
	for range max(l.Workers, 1) {
		wg.Go(func() {
			for l.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
}

// EnqueueAll asks for a reconcile of every key. Keys added before the
// caches have synced wait for the workers; after Run has returned they are
// dropped.
func (l *Loop) EnqueueAll() {
	for _, k := range l.Keys() {
		l.Queue.Add(k)
	}
}

// Current holds the Loop that is running, if any, so that others (a
// publisher's Trigger) can ask it to reconcile every key.
type Current struct {
	mu   sync.Mutex
	loop *Loop
}

// Run runs l as the current loop until ctx ends.
func (c *Current) Run(ctx context.Context, l *Loop) {
	c.set(l)
	defer c.set(nil)
	l.Run(ctx)
}

// EnqueueAll asks the current loop to reconcile every key; it does
// nothing when no loop runs (a loop reconciles every key when it starts).
func (c *Current) EnqueueAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.loop != nil {
		c.loop.EnqueueAll()
	}
}

func (c *Current) set(l *Loop) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.loop = l
}

func (l *Loop) resyncLoop(ctx context.Context) {
	t := l.Clock.NewTicker(l.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			l.EnqueueAll()
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
