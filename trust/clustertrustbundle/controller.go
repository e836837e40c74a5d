package clustertrustbundle

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/go-logr/logr"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/workload-ca/workload-ca/internal/contest"
	"github.com/workload-ca/workload-ca/internal/keyloop"
)

// run is the state of one Run: an informer and store per signer, and the
// workqueue, keyed by signer name.
type run struct {
	p         *Publisher
	api       *bundleAPI
	queue     workqueue.TypedRateLimitingInterface[string]
	stores    map[string]cache.Store // by signer
	informers []cache.Controller
	// written knows, per bundle name, the content we last wrote or found
	// there, to tell another writer's edits from our own changes.
	written *contest.Tracker
}

func newRun(p *Publisher, api *bundleAPI) *run {
	r := &run{
		p:       p,
		api:     api,
		stores:  make(map[string]cache.Store, len(p.targets)),
		written: contest.NewTracker(p.clock, p.repair),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Clock: p.clock}),
	}
	logger := logr.FromSlogHandler(p.log.Handler())
	for signer := range p.targets {
		// spec.signerName is a supported field selector in every served
		// version of the API, and immutable, so no bundle of ours leaves
		// the selection while it exists.
		store, informer := cache.NewInformerWithOptions(cache.InformerOptions{
			ListerWatcher: api.listWatch(fields.OneTermEqualSelector("spec.signerName", signer).String()),
			ObjectType:    api.objectType,
			Handler:       enqueueOn(r.queue, signer),
			Transform:     toV1Transform,
			Logger:        &logger,
		})
		r.stores[signer] = store
		r.informers = append(r.informers, informer)
	}
	return r
}

// enqueueOn reconciles signer on any event: someone created, edited or
// deleted one of its bundles (our own writes come back too, and find
// nothing to do).
func enqueueOn(q workqueue.TypedInterface[string], signer string) cache.ResourceEventHandler {
	add := func(any) { q.Add(signer) }
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    add,
		UpdateFunc: func(_, _ any) { q.Add(signer) },
		DeleteFunc: add,
	}
}

// loop is the run's controller loop: its informers, and every signer as
// the keys.
func (r *run) loop() *keyloop.Loop {
	return &keyloop.Loop{Queue: r.queue, Informers: r.informers, Keys: r.p.signers,
		Reconcile: r.sync, Clock: r.p.clock, Resync: r.p.resync}
}

// sync reconciles one signer, reports the result, and logs a failure
// (which the loop retries with backoff).
func (r *run) sync(ctx context.Context, signer string) error {
	result, err := r.reconcile(ctx, signer)
	if ctx.Err() != nil {
		return nil // shutting down: neither a result nor a retry
	}
	r.p.obs.Published(result)
	if err != nil {
		r.p.log.ErrorContext(ctx, "publishing ClusterTrustBundle failed, will retry",
			"signer", signer, "retries", r.queue.NumRequeues(signer), "error", err)
	}
	return err
}

// reconcile converges signer's bundles: the desired bundle exists with the
// current roots and our labels, and no other bundle of the signer that we
// own remains. The desired bundle is written before anything is deleted.
func (r *run) reconcile(ctx context.Context, signer string) (string, error) {
	t, ok := r.p.targets[signer]
	if !ok {
		return ResultError, fmt.Errorf("unknown signer %q", signer)
	}
	content, err := bundleContent(r.p.roots())
	if err != nil {
		return ResultError, err
	}
	name := t.name(content)
	result, err := r.ensure(ctx, t, name, content)
	if err != nil {
		return ResultError, err
	}
	if err := r.deleteStale(ctx, t, name); err != nil {
		return ResultError, err
	}
	return result, nil
}

// ensure creates bundle name, or updates it if its content, its stamp or
// our labels differ. Labels others added are kept. Content someone else wrote over
// ours is restored at most once per RepairInterval (see repair).
func (r *run) ensure(ctx context.Context, t target, name, content string) (string, error) {
	cur, err := r.get(t.signer, name)
	if err != nil {
		return ResultError, err
	}
	if cur == nil {
		if cur, err = r.createOrGet(ctx, t, name, content); cur == nil {
			if err != nil {
				return ResultError, err
			}
			r.written.Wrote(name, content)
			return ResultCreated, nil
		}
	}
	if cur.Spec.TrustBundle == content && hasLabels(cur.Labels, r.p.labels) && contest.Stamped(cur.Annotations, content) {
		r.written.Wrote(name, content)
		return ResultUnchanged, nil
	}
	if r.written.Edited(name, cur.Spec.TrustBundle, cur.Annotations) {
		return r.repair(ctx, t, cur, content)
	}
	if err := r.update(ctx, cur, content); err != nil {
		return ResultError, err
	}
	r.written.Wrote(name, content)
	return ResultUpdated, nil
}

// createOrGet creates bundle name; it returns nil once created. If the
// bundle exists already, the cache lags behind a create (ours, moments
// ago, or someone's): it returns the live object to compare with instead.
// If that was deleted in the meantime, it creates the bundle once more.
func (r *run) createOrGet(ctx context.Context, t target, name, content string) (*certv1.ClusterTrustBundle, error) {
	err := r.create(ctx, t, name, content)
	if err == nil || !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	cur, err := r.api.get(ctx, name)
	if apierrors.IsNotFound(err) {
		return nil, r.create(ctx, t, name, content)
	}
	if err != nil {
		return nil, fmt.Errorf("get ClusterTrustBundle %s: %w", name, err)
	}
	return cur, nil
}

// repair restores our content in cur, which someone else changed since we
// wrote it. If it repaired this bundle less than RepairInterval ago, it
// re-queues the signer for when the interval ends instead. The other
// writers are named from the live object's managed fields (the cache drops
// them).
func (r *run) repair(ctx context.Context, t target, cur *certv1.ClusterTrustBundle, content string) (string, error) {
	if wait := r.written.Repair(cur.Name); wait > 0 {
		r.queue.AddAfter(t.signer, wait)
		r.p.log.DebugContext(ctx, "ClusterTrustBundle changed again by another writer; restoring it later",
			"name", cur.Name, "in", wait)
		return ResultDeferred, nil
	}
	live, err := r.api.get(ctx, cur.Name)
	if err != nil { // deleted meanwhile: the retry creates it
		return ResultError, fmt.Errorf("get ClusterTrustBundle %s: %w", cur.Name, err)
	}
	writers := contest.Writers(live, FieldManager, "spec", "trustBundle")
	if len(writers) == 0 {
		writers = []string{"unknown"}
	}
	r.p.log.WarnContext(ctx, "another writer changed the ClusterTrustBundle; restoring it (is another publisher of it, such as istiod's, running?)",
		"name", cur.Name, "signer", t.signer, "writers", writers, "nextRepairAfter", r.p.repair)
	live.ManagedFields = nil // unchanged: the API server keeps tracking them
	if err := r.update(ctx, live, content); err != nil {
		return ResultError, err
	}
	r.written.Wrote(cur.Name, content)
	return ResultRepaired, nil
}

func (r *run) create(ctx context.Context, t target, name, content string) error {
	b := &certv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: maps.Clone(r.p.labels), Annotations: contest.Stamp(nil, content)},
		Spec:       certv1.ClusterTrustBundleSpec{SignerName: t.signer, TrustBundle: content},
	}
	if err := r.api.create(ctx, b); err != nil {
		return fmt.Errorf("create ClusterTrustBundle %s: %w", name, err)
	}
	r.p.log.InfoContext(ctx, "created ClusterTrustBundle", "name", name, "signer", t.signer)
	return nil
}

// update writes content, its stamp and our labels over cur, keeping other
// labels and annotations.
func (r *run) update(ctx context.Context, cur *certv1.ClusterTrustBundle, content string) error {
	b := cur.DeepCopy()
	b.Spec.TrustBundle = content
	b.Annotations = contest.Stamp(b.Annotations, content)
	if b.Labels == nil {
		b.Labels = make(map[string]string, len(r.p.labels))
	}
	maps.Copy(b.Labels, r.p.labels)
	if err := r.api.update(ctx, b); err != nil {
		return fmt.Errorf("update ClusterTrustBundle %s: %w", b.Name, err)
	}
	r.p.log.InfoContext(ctx, "updated ClusterTrustBundle", "name", b.Name, "signer", b.Spec.SignerName,
		"contentChanged", cur.Spec.TrustBundle != content)
	return nil
}

// get returns bundle name of signer from the informer's cache, or nil.
func (r *run) get(signer, name string) (*certv1.ClusterTrustBundle, error) {
	obj, ok, err := r.stores[signer].GetByKey(name)
	if err != nil || !ok {
		return nil, err
	}
	b, ok := obj.(*certv1.ClusterTrustBundle)
	if !ok {
		return nil, fmt.Errorf("cache holds a %T for ClusterTrustBundle %s", obj, name)
	}
	return b, nil
}

// deleteStale deletes the bundles of t's signer that we own, except keep.
// A precondition on UID and resourceVersion makes sure we delete only the
// version we looked at: one relabelled meanwhile is left alone.
func (r *run) deleteStale(ctx context.Context, t target, keep string) error {
	var errs []error
	for _, obj := range r.stores[t.signer].List() {
		b, ok := obj.(*certv1.ClusterTrustBundle)
		if !ok || b.Name == keep || b.Spec.SignerName != t.signer || !hasLabels(b.Labels, r.p.labels) {
			continue
		}
		pre := metav1.Preconditions{UID: &b.UID, ResourceVersion: &b.ResourceVersion}
		err := r.api.delete(ctx, b.Name, metav1.DeleteOptions{Preconditions: &pre})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			errs = append(errs, fmt.Errorf("delete stale ClusterTrustBundle %s: %w", b.Name, err))
		default:
			r.written.Forget(b.Name)
			r.p.log.InfoContext(ctx, "deleted stale ClusterTrustBundle", "name", b.Name, "signer", t.signer)
		}
	}
	return errors.Join(errs...)
}
