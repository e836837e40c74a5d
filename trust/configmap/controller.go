package configmap

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/workload-ca/workload-ca/internal/contest"
	"github.com/workload-ca/workload-ca/internal/keyloop"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

// errRequeue marks a reconcile that lost a race with another writer: the
// ConfigMap changed between the cache read and our write. It is retried
// with backoff like an error, but is not one.
var errRequeue = errors.New("ConfigMap changed meanwhile")

// run is the state of one Run: the namespace and ConfigMap informers and
// stores, and the workqueue, keyed by namespace name.
type run struct {
	p          *Publisher
	queue      workqueue.TypedRateLimitingInterface[string]
	namespaces cache.Store // keyed by name
	configMaps cache.Store // keyed by namespace/name; only ConfigMapName
	informers  []cache.Controller
	// written knows, per namespace, the roots we last wrote or found
	// there, to tell another writer's edits from our own changes.
	written *contest.Tracker
}

func newRun(p *Publisher) *run {
	r := &run{
		p:       p,
		written: contest.NewTracker(p.clock, p.repair),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Clock: p.clock}),
	}
	logger := logr.FromSlogHandler(p.log.Handler())
	core := p.client.CoreV1()
	// Every namespace is watched, not only selected ones: the selector is
	// applied in reconcile, so a namespace whose labels change is
	// reconciled like any other event.
	nsStore, nsInformer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: listWatch(p.client, "",
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return core.Namespaces().List(ctx, o)
			},
			core.Namespaces().Watch),
		ObjectType: &corev1.Namespace{},
		Handler:    enqueueNamespace(r.queue),
		Transform:  dropManagedFields,
		Logger:     &logger,
	})
	// metadata.name selects our ConfigMap in every namespace; the name is
	// immutable, so an edited ConfigMap never leaves the selection.
	cmStore, cmInformer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: listWatch(p.client, fields.OneTermEqualSelector("metadata.name", ConfigMapName).String(),
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return core.ConfigMaps(metav1.NamespaceAll).List(ctx, o)
			},
			core.ConfigMaps(metav1.NamespaceAll).Watch),
		ObjectType: &corev1.ConfigMap{},
		Handler:    enqueueNamespace(r.queue),
		Transform:  dropManagedFields,
		Logger:     &logger,
	})
	r.namespaces, r.configMaps = nsStore, cmStore
	r.informers = []cache.Controller{nsInformer, cmInformer}
	return r
}

// listWatch lists and watches with fieldSelector ("" for everything).
func listWatch(client kubernetes.Interface, fieldSelector string,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
) cache.ListerWatcher {
	// client tells the reflector whether watch-list streaming works (not
	// with the fake clientset).
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

// dropManagedFields is the informers' transform: managed fields are never
// read and are a large part of every object. It is idempotent, as
// informers require.
func dropManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil // e.g. cache.DeletedFinalStateUnknown
}

// enqueueNamespace reconciles the namespace an event is about on any
// event: a namespace was created, relabelled or deleted, or someone
// created, edited or deleted its ConfigMap (our own writes come back too,
// and find nothing to do).
func enqueueNamespace(q workqueue.TypedInterface[string]) cache.ResourceEventHandler {
	add := func(obj any) {
		if ns, ok := namespaceOf(obj); ok {
			q.Add(ns)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    add,
		UpdateFunc: func(_, obj any) { add(obj) },
		DeleteFunc: add,
	}
}

// namespaceOf returns a Namespace's own name, or a ConfigMap's namespace.
// Deletions the informer missed arrive as DeletedFinalStateUnknown, whose
// key has the same form, so they are handled alike.
func namespaceOf(obj any) (string, bool) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return "", false
	}
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return "", false
	}
	if ns == "" {
		return name, true // a Namespace: cluster-scoped, keyed by name
	}
	return ns, true
}

// loop is the run's controller loop: its informers, and every namespace
// the cache knows as the keys (reconcile skips those not selected).
func (r *run) loop() *keyloop.Loop {
	return &keyloop.Loop{Queue: r.queue, Informers: r.informers, Keys: r.namespaces.ListKeys,
		Reconcile: r.sync, Clock: r.p.clock, Resync: r.p.resync}
}

// sync reconciles one namespace, reports the result, and logs a failure
// (which the loop retries with backoff).
func (r *run) sync(ctx context.Context, ns string) error {
	result, err := r.reconcile(ctx, ns)
	if ctx.Err() != nil {
		return nil // shutting down: neither a result nor a retry
	}
	r.p.obs.Published(result)
	switch {
	case errors.Is(err, errRequeue):
		r.p.log.DebugContext(ctx, "ConfigMap changed while publishing, will retry",
			"namespace", ns, "error", err)
	case err != nil:
		r.p.log.ErrorContext(ctx, "publishing ConfigMap failed, will retry",
			"namespace", ns, "retries", r.queue.NumRequeues(ns), "error", err)
	}
	return err
}

// reconcile converges namespace ns: if it is selected and not being
// deleted, its ConfigMapName holds the current roots under DataKey and
// carries our labels.
func (r *run) reconcile(ctx context.Context, ns string) (string, error) {
	n, err := r.namespace(ns)
	if err != nil {
		return ResultError, err
	}
	if why := r.skipReason(n); why != "" {
		r.p.log.DebugContext(ctx, "not publishing ConfigMap", "namespace", ns, "reason", why)
		r.written.Forget(ns)
		return ResultSkipped, nil
	}
	content, err := rootset.PEM(r.p.roots())
	if err != nil {
		return ResultError, err
	}
	return r.ensure(ctx, ns, content)
}

// skipReason says why namespace n (nil: not in the cache) gets no
// ConfigMap, or "".
func (r *run) skipReason(n *corev1.Namespace) string {
	switch {
	case n == nil:
		return "namespace not found"
	case n.DeletionTimestamp != nil || n.Status.Phase == corev1.NamespaceTerminating:
		return "namespace is being deleted"
	case !r.p.selector.Matches(labels.Set(n.Labels)):
		return "namespace not selected"
	}
	return ""
}

// ensure creates the ConfigMap in ns, or updates it if its roots, their
// stamp or our labels differ. Roots someone else wrote over ours are restored at most
// once per RepairInterval (see repair).
func (r *run) ensure(ctx context.Context, ns, content string) (string, error) {
	cur, err := r.cachedConfigMap(ns)
	if err != nil {
		return ResultError, err
	}
	if cur == nil {
		var result string
		if result, cur, err = r.createOrGet(ctx, ns, content); cur == nil {
			if result == ResultCreated {
				r.written.Wrote(ns, content)
			}
			return result, err
		}
	}
	if cur.Data[DataKey] == content && hasLabels(cur.Labels, r.p.labels) && contest.Stamped(cur.Annotations, content) {
		r.written.Wrote(ns, content)
		return ResultUnchanged, nil
	}
	if r.written.Edited(ns, cur.Data[DataKey], cur.Annotations) {
		return r.repair(ctx, cur, content)
	}
	result, err := r.update(ctx, cur, content)
	if err == nil {
		r.written.Wrote(ns, content)
	}
	return result, err
}

// repair restores our roots in cur, which someone else changed since we
// wrote them. If it repaired this namespace less than RepairInterval ago,
// it re-queues the namespace for when the interval ends instead. The other
// writers are named from the live object's managed fields (the cache drops
// them).
func (r *run) repair(ctx context.Context, cur *corev1.ConfigMap, content string) (string, error) {
	ns := cur.Namespace
	if wait := r.written.Repair(ns); wait > 0 {
		r.queue.AddAfter(ns, wait)
		r.p.log.DebugContext(ctx, "roots in ConfigMap changed again by another writer; restoring them later",
			"namespace", ns, "name", cur.Name, "in", wait)
		return ResultDeferred, nil
	}
	live, err := r.p.client.CoreV1().ConfigMaps(ns).Get(ctx, cur.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return ResultRequeued, fmt.Errorf("%w: ConfigMap %s/%s deleted meanwhile", errRequeue, ns, cur.Name)
	case err != nil:
		return ResultError, fmt.Errorf("get ConfigMap %s/%s: %w", ns, cur.Name, err)
	}
	writers := contest.Writers(live, FieldManager, "data", DataKey)
	if len(writers) == 0 {
		writers = []string{"unknown"}
	}
	r.p.log.WarnContext(ctx, "another writer changed the roots in ConfigMap; restoring them (is another publisher of it, such as istiod's, running?)",
		"namespace", ns, "name", cur.Name, "writers", writers, "nextRepairAfter", r.p.repair)
	live.ManagedFields = nil // unchanged: the API server keeps tracking them
	if result, err := r.update(ctx, live, content); err != nil {
		return result, err
	}
	r.written.Wrote(ns, content)
	return ResultRepaired, nil
}

// createOrGet creates the ConfigMap in ns. If it exists already, the cache
// lags behind a create (ours moments ago, or someone's): it returns the
// live object to compare with instead.
func (r *run) createOrGet(ctx context.Context, ns, content string) (string, *corev1.ConfigMap, error) {
	err := r.create(ctx, ns, content)
	switch {
	case err == nil:
		return ResultCreated, nil, nil
	case namespaceGone(err):
		// The cache has not yet seen the namespace's deletion; its event
		// will come, and there is nothing to publish there.
		r.p.log.DebugContext(ctx, "not publishing ConfigMap", "namespace", ns, "reason", "namespace is being deleted")
		return ResultSkipped, nil, nil
	case !apierrors.IsAlreadyExists(err):
		return ResultError, nil, err
	}
	cur, err := r.p.client.CoreV1().ConfigMaps(ns).Get(ctx, ConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ResultRequeued, nil, fmt.Errorf("%w: ConfigMap %s/%s deleted after create found it", errRequeue, ns, ConfigMapName)
	}
	if err != nil {
		return ResultError, nil, fmt.Errorf("get ConfigMap %s/%s: %w", ns, ConfigMapName, err)
	}
	return "", cur, nil
}

// namespaceGone reports whether a create failed because its namespace no
// longer exists or is being deleted (the apiserver's NamespaceLifecycle
// admission refuses new objects there).
func namespaceGone(err error) bool {
	return apierrors.IsNotFound(err) ||
		(apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause))
}

func (r *run) create(ctx context.Context, ns, content string) error {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: ns, Labels: maps.Clone(r.p.labels),
			Annotations: contest.Stamp(nil, content)},
		Data: map[string]string{DataKey: content},
	}
	if _, err := r.p.client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
		return fmt.Errorf("create ConfigMap %s/%s: %w", ns, ConfigMapName, err)
	}
	r.p.log.InfoContext(ctx, "created ConfigMap", "namespace", ns, "name", ConfigMapName)
	return nil
}

// update writes content, its stamp and our labels over cur, keeping other
// data keys, labels and annotations. A ConfigMap someone else published
// (e.g. istiod) is adopted this way.
func (r *run) update(ctx context.Context, cur *corev1.ConfigMap, content string) (string, error) {
	cm := cur.DeepCopy()
	cm.Annotations = contest.Stamp(cm.Annotations, content)
	if cm.Data == nil {
		cm.Data = make(map[string]string, 1)
	}
	cm.Data[DataKey] = content
	// A key may not be in both data and binaryData.
	delete(cm.BinaryData, DataKey)
	if cm.Labels == nil {
		cm.Labels = make(map[string]string, len(r.p.labels))
	}
	maps.Copy(cm.Labels, r.p.labels)
	_, err := r.p.client.CoreV1().ConfigMaps(cm.Namespace).Update(ctx, cm, metav1.UpdateOptions{FieldManager: FieldManager})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		// Deleted or edited since the cache saw it: its event re-queues
		// the namespace too, but do not count on the cache being current.
		return ResultRequeued, fmt.Errorf("%w: update ConfigMap %s/%s: %w", errRequeue, cm.Namespace, cm.Name, err)
	case err != nil:
		return ResultError, fmt.Errorf("update ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	r.p.log.InfoContext(ctx, "updated ConfigMap", "namespace", cm.Namespace, "name", cm.Name,
		"contentChanged", cur.Data[DataKey] != content,
		"adopted", cur.Labels[LabelManagedBy] != ManagedBy)
	return ResultUpdated, nil
}

// namespace returns namespace ns from the informer's cache, or nil.
func (r *run) namespace(ns string) (*corev1.Namespace, error) {
	obj, ok, err := r.namespaces.GetByKey(ns)
	if err != nil || !ok {
		return nil, err
	}
	n, ok := obj.(*corev1.Namespace)
	if !ok {
		return nil, fmt.Errorf("cache holds a %T for namespace %s", obj, ns)
	}
	return n, nil
}

// cachedConfigMap returns the ConfigMap in ns from the informer's cache,
// or nil.
func (r *run) cachedConfigMap(ns string) (*corev1.ConfigMap, error) {
	obj, ok, err := r.configMaps.GetByKey(ns + "/" + ConfigMapName)
	if err != nil || !ok {
		return nil, err
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return nil, fmt.Errorf("cache holds a %T for ConfigMap %s/%s", obj, ns, ConfigMapName)
	}
	return cm, nil
}
