package clustertrustbundle

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/go-logr/logr"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/workload-ca/workload-ca/trust"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

// run is the state of one Run: an informer and store per signer, and the
// workqueue, keyed by signer name.
type run struct {
	p         *Publisher
	api       *bundleAPI
	queue     workqueue.TypedRateLimitingInterface[string]
	stores    map[string]cache.Store // by signer
	informers []cache.Controller
	writer    *trust.Writer[*certv1.ClusterTrustBundle]
}

func newRun(p *Publisher, api *bundleAPI) *run {
	r := &run{p: p, api: api, stores: make(map[string]cache.Store, len(p.targets)), queue: trust.NewQueue(p.opts.Clock)}
	r.writer = trust.NewWriter(trust.WriterConfig[*certv1.ClusterTrustBundle]{Kind: kind, Objects: r, Labels: p.labels,
		LabelsOf:     func(name string) map[string]string { return withStage(p.labels, name) },
		FieldManager: FieldManager, ContentField: []string{"spec", "trustBundle"}, Queue: r.queue, Options: p.opts})
	logger := logr.FromSlogHandler(p.opts.Logger.Handler())
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

func (r *run) Queue() workqueue.TypedRateLimitingInterface[string] { return r.queue }
func (r *run) Informers() []cache.Controller                       { return r.informers }

// Keys are every signer.
func (r *run) Keys() []string { return r.p.signers() }

// Reconcile converges one signer's bundles (trust.Target).
func (r *run) Reconcile(ctx context.Context, signer string) (string, error) {
	return r.reconcile(ctx, signer)
}

// reconcile converges signer's bundles: the desired bundle exists with the
// current roots and our labels, and no other bundle of the signer that we
// own remains. The desired bundle is written before anything is deleted.
func (r *run) reconcile(ctx context.Context, signer string) (string, error) {
	t, ok := r.p.targets[signer]
	if !ok {
		return trust.ResultError, fmt.Errorf("unknown signer %q", signer)
	}
	roots := r.p.opts.Roots()
	var preview []*x509.Certificate
	if r.p.preview != nil {
		preview = r.p.preview()
	}
	content, err := bundleContent(slices.DeleteFunc(slices.Clone(roots), func(c *x509.Certificate) bool {
		return slices.ContainsFunc(preview, c.Equal)
	}))
	if err != nil && !t.peer.IsZero() {
		// A peer's roots that fail the checks are left out: its bundles
		// stay as they are until it serves roots that pass.
		r.p.leftOut.Report(ctx, []rootset.LeftOut{{TrustDomain: t.peer, Reason: reasonOf(err), Err: err}})
		return trust.ResultSkipped, nil
	}
	if err != nil {
		return trust.ResultError, err
	}
	if !t.peer.IsZero() {
		r.p.leftOut.Report(ctx, nil)
	}
	want := map[string]string{t.name(content): content}
	if t.preview {
		all, err := bundleContent(roots)
		if err != nil {
			return trust.ResultError, err
		}
		want[t.previewName(all)] = all
	}
	result := trust.ResultUnchanged
	for _, name := range slices.Sorted(maps.Keys(want)) {
		res, err := r.writer.Ensure(ctx, signer, name, want[name])
		if err != nil {
			return res, err
		}
		if res != trust.ResultUnchanged {
			result = res
		}
	}
	if err := r.deleteStale(ctx, t, want); err != nil {
		return trust.ResultError, err
	}
	return result, nil
}

// Content is the roots a bundle holds (trust.Objects).
func (r *run) Content(b *certv1.ClusterTrustBundle) string { return b.Spec.TrustBundle }

// Cached returns bundle name of signer from the informer's cache.
func (r *run) Cached(signer, name string) (*certv1.ClusterTrustBundle, bool, error) {
	obj, ok, err := r.stores[signer].GetByKey(name)
	if err != nil || !ok {
		return nil, false, err
	}
	b, ok := obj.(*certv1.ClusterTrustBundle)
	if !ok {
		return nil, false, fmt.Errorf("cache holds a %T for ClusterTrustBundle %s", obj, name)
	}
	return b, true, nil
}

// Get reads the live bundle.
func (r *run) Get(ctx context.Context, _, name string) (*certv1.ClusterTrustBundle, error) {
	live, err := r.api.get(ctx, name)
	if err != nil { // deleted meanwhile: the retry creates it
		return nil, fmt.Errorf("get ClusterTrustBundle %s: %w", name, err)
	}
	return live, nil
}

// CreateOrGet creates bundle name. If the bundle exists already, the cache
// lags behind a create (ours, moments ago, or someone's): it returns the
// live object to compare with instead. If that was deleted in the
// meantime, it creates the bundle once more.
func (r *run) CreateOrGet(ctx context.Context, signer, name, content string) (*certv1.ClusterTrustBundle, bool, error) {
	err := r.create(ctx, signer, name, content)
	if err == nil || !apierrors.IsAlreadyExists(err) {
		return nil, false, err
	}
	cur, err := r.api.get(ctx, name)
	if apierrors.IsNotFound(err) {
		return nil, false, r.create(ctx, signer, name, content)
	}
	if err != nil {
		return nil, false, fmt.Errorf("get ClusterTrustBundle %s: %w", name, err)
	}
	return cur, true, nil
}

func (r *run) create(ctx context.Context, signer, name, content string) error {
	b := &certv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       certv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: content},
	}
	r.writer.Mark(b, content)
	if err := r.api.create(ctx, b); err != nil {
		return fmt.Errorf("create ClusterTrustBundle %s: %w", name, err)
	}
	r.p.opts.Logger.InfoContext(ctx, "created ClusterTrustBundle", "name", name, "signer", signer)
	return nil
}

// Update writes content, its stamp and our labels over cur, keeping other
// labels and annotations.
func (r *run) Update(ctx context.Context, cur *certv1.ClusterTrustBundle, content string) error {
	b := cur.DeepCopy()
	b.Spec.TrustBundle = content
	r.writer.Mark(b, content)
	if err := r.api.update(ctx, b); err != nil {
		return fmt.Errorf("update ClusterTrustBundle %s: %w", b.Name, err)
	}
	r.p.opts.Logger.InfoContext(ctx, "updated ClusterTrustBundle", "name", b.Name, "signer", b.Spec.SignerName,
		"contentChanged", cur.Spec.TrustBundle != content)
	return nil
}

// deleteStale deletes the bundles of t's signer that we own, except those
// named in keep.
// A precondition on UID and resourceVersion makes sure we delete only the
// version we looked at: one relabelled meanwhile is left alone.
func (r *run) deleteStale(ctx context.Context, t target, keep map[string]string) error {
	var errs []error
	for _, obj := range r.stores[t.signer].List() {
		b, ok := obj.(*certv1.ClusterTrustBundle)
		if _, kept := keep[b.Name]; !ok || kept || b.Spec.SignerName != t.signer || !trust.HasLabels(b.Labels, r.p.labels) {
			continue
		}
		pre := metav1.Preconditions{UID: &b.UID, ResourceVersion: &b.ResourceVersion}
		err := r.api.delete(ctx, b.Name, metav1.DeleteOptions{Preconditions: &pre})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			errs = append(errs, fmt.Errorf("delete stale ClusterTrustBundle %s: %w", b.Name, err))
		default:
			r.writer.Forget(t.signer, b.Name)
			r.p.opts.Logger.InfoContext(ctx, "deleted stale ClusterTrustBundle", "name", b.Name, "signer", t.signer)
		}
	}
	return errors.Join(errs...)
}

// reasonOf is the rootset.Reason* of roots bundleContent refused.
func reasonOf(err error) string {
	if errors.Is(err, errTooLarge) {
		return rootset.ReasonOverBudget
	}
	return rootset.ReasonInvalid
}
