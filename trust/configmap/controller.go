package configmap

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/workload-ca/workload-ca/trust"
)

// run is the state of one Run: the namespace and ConfigMap informers and
// stores, and the workqueue, keyed by namespace name.
type run struct {
	p          *Publisher
	queue      workqueue.TypedRateLimitingInterface[string]
	namespaces cache.Store // keyed by name
	configMaps cache.Store // keyed by namespace/name; only ConfigMapName
	informers  []cache.Controller
	writer     *trust.Writer[*corev1.ConfigMap]
}

func newRun(p *Publisher) *run {
	r := &run{p: p, queue: trust.NewQueue(p.opts.Clock)}
	r.writer = trust.NewWriter(trust.WriterConfig[*corev1.ConfigMap]{Kind: kind, Objects: r, Labels: p.labels,
		FieldManager: FieldManager, ContentField: []string{"data", DataKey}, Queue: r.queue, Options: p.opts})
	logger := logr.FromSlogHandler(p.opts.Logger.Handler())
	core := p.client.CoreV1()
	// Every namespace is watched, not only selected ones: the selector is
	// applied in reconcile, so a namespace whose labels change is
	// reconciled like any other event.
	nsStore, nsInformer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: trust.ListWatch(p.client, "",
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return core.Namespaces().List(ctx, o)
			},
			core.Namespaces().Watch),
		ObjectType: &corev1.Namespace{},
		Handler:    enqueueNamespace(r.queue),
		Transform:  trust.DropManagedFields,
		Logger:     &logger,
	})
	// metadata.name selects our ConfigMap in every namespace; the name is
	// immutable, so an edited ConfigMap never leaves the selection.
	cmStore, cmInformer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: trust.ListWatch(p.client, fields.OneTermEqualSelector("metadata.name", ConfigMapName).String(),
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return core.ConfigMaps(metav1.NamespaceAll).List(ctx, o)
			},
			core.ConfigMaps(metav1.NamespaceAll).Watch),
		ObjectType: &corev1.ConfigMap{},
		Handler:    enqueueNamespace(r.queue),
		Transform:  trust.DropManagedFields,
		Logger:     &logger,
	})
	r.namespaces, r.configMaps = nsStore, cmStore
	r.informers = []cache.Controller{nsInformer, cmInformer}
	return r
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

func (r *run) Queue() workqueue.TypedRateLimitingInterface[string] { return r.queue }
func (r *run) Informers() []cache.Controller                       { return r.informers }

// Keys are every namespace the cache knows (reconcile skips those not
// selected).
func (r *run) Keys() []string { return r.namespaces.ListKeys() }

// Reconcile converges one namespace (trust.Target).
func (r *run) Reconcile(ctx context.Context, ns string) (string, error) { return r.reconcile(ctx, ns) }

// reconcile converges namespace ns: if it is selected and not being
// deleted, its ConfigMapName holds the current roots under DataKey and
// carries our labels.
func (r *run) reconcile(ctx context.Context, ns string) (string, error) {
	n, err := r.namespace(ns)
	if err != nil {
		return trust.ResultError, err
	}
	if why := r.skipReason(n); why != "" {
		r.p.opts.Logger.DebugContext(ctx, "not publishing ConfigMap", "namespace", ns, "reason", why)
		r.writer.Forget(ns, ConfigMapName)
		return trust.ResultSkipped, nil
	}
	content, err := r.p.content(ctx)
	if err != nil {
		return trust.ResultError, err
	}
	return r.writer.Ensure(ctx, ns, ConfigMapName, content)
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

// Content is the roots a ConfigMap holds (trust.Objects).
func (r *run) Content(cm *corev1.ConfigMap) string { return cm.Data[DataKey] }

// Cached returns the ConfigMap in ns from the informer's cache.
func (r *run) Cached(ns, name string) (*corev1.ConfigMap, bool, error) {
	obj, ok, err := r.configMaps.GetByKey(ns + "/" + name)
	if err != nil || !ok {
		return nil, false, err
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return nil, false, fmt.Errorf("cache holds a %T for ConfigMap %s/%s", obj, ns, name)
	}
	return cm, true, nil
}

// Get reads the live ConfigMap; one deleted meanwhile requeues.
func (r *run) Get(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	live, err := r.p.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w: ConfigMap %s/%s deleted meanwhile", trust.ErrRequeue, ns, name)
	case err != nil:
		return nil, fmt.Errorf("get ConfigMap %s/%s: %w", ns, name, err)
	}
	return live, nil
}

// CreateOrGet creates the ConfigMap in ns. If it exists already, the cache
// lags behind a create (ours moments ago, or someone's): it returns the
// live object to compare with instead.
func (r *run) CreateOrGet(ctx context.Context, ns, name, content string) (*corev1.ConfigMap, bool, error) {
	err := r.create(ctx, ns, name, content)
	switch {
	case err == nil:
		return nil, false, nil
	case namespaceGone(err):
		// The cache has not yet seen the namespace's deletion; its event
		// will come, and there is nothing to publish there.
		r.p.opts.Logger.DebugContext(ctx, "not publishing ConfigMap", "namespace", ns, "reason", "namespace is being deleted")
		return nil, false, trust.ErrSkip
	case !apierrors.IsAlreadyExists(err):
		return nil, false, err
	}
	cur, err := r.Get(ctx, ns, name)
	if err != nil {
		return nil, false, err
	}
	return cur, true, nil
}

// namespaceGone reports whether a create failed because its namespace no
// longer exists or is being deleted (the apiserver's NamespaceLifecycle
// admission refuses new objects there).
func namespaceGone(err error) bool {
	return apierrors.IsNotFound(err) ||
		(apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause))
}

func (r *run) create(ctx context.Context, ns, name, content string) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: map[string]string{DataKey: content}}
	r.writer.Mark(cm, content)
	if _, err := r.p.client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
		return fmt.Errorf("create ConfigMap %s/%s: %w", ns, name, err)
	}
	r.p.opts.Logger.InfoContext(ctx, "created ConfigMap", "namespace", ns, "name", name)
	return nil
}

// Update writes content, its stamp and our labels over cur, keeping other
// data keys, labels and annotations. A ConfigMap someone else published
// (e.g. istiod) is adopted this way.
func (r *run) Update(ctx context.Context, cur *corev1.ConfigMap, content string) error {
	cm := cur.DeepCopy()
	r.writer.Mark(cm, content)
	if cm.Data == nil {
		cm.Data = make(map[string]string, 1)
	}
	cm.Data[DataKey] = content
	// A key may not be in both data and binaryData.
	delete(cm.BinaryData, DataKey)
	_, err := r.p.client.CoreV1().ConfigMaps(cm.Namespace).Update(ctx, cm, metav1.UpdateOptions{FieldManager: FieldManager})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		// Deleted or edited since the cache saw it: its event re-queues
		// the namespace too, but do not count on the cache being current.
		return fmt.Errorf("%w: update ConfigMap %s/%s: %w", trust.ErrRequeue, cm.Namespace, cm.Name, err)
	case err != nil:
		return fmt.Errorf("update ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	r.p.opts.Logger.InfoContext(ctx, "updated ConfigMap", "namespace", cm.Namespace, "name", cm.Name,
		"contentChanged", cur.Data[DataKey] != content,
		"adopted", cur.Labels[LabelManagedBy] != ManagedBy)
	return nil
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
