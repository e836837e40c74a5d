package podindex

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// podRef is a pod cut down to what the index reads. The reflector's initial
// list holds every pod at once before the store sees any of them (a
// paginated list is concatenated, a watch-list is streamed into a temporary
// store); holding podRefs there instead of pods keeps that transient peak at
// a few hundred bytes per pod instead of kilobytes.
//
// It keeps an ObjectMeta (name, namespace and uid only) so that client-go's
// key functions work on it whether they run before or after the transform.
type podRef struct {
	metav1.ObjectMeta
	NodeName       string
	ServiceAccount string
	Phase          corev1.PodPhase
}

func (p *podRef) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies p; a podRef holds only strings, so a shallow copy
// is a deep one.
func (p *podRef) DeepCopyObject() runtime.Object {
	c := *p
	return &c
}

func refOf(p *corev1.Pod) *podRef {
	return &podRef{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID,
			DeletionTimestamp: p.DeletionTimestamp},
		NodeName:       p.Spec.NodeName,
		ServiceAccount: p.Spec.ServiceAccountName,
		Phase:          p.Status.Phase,
	}
}

// compact is the cache.TransformFunc the reflector applies in its temporary
// watch-list store. It is idempotent: anything but a *corev1.Pod passes as is.
func compact(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		return refOf(p), nil
	}
	return obj, nil
}

// compactList wraps a pod list call so each page is cut down as it arrives
// and the full page becomes garbage at once.
func compactList(list func(context.Context, metav1.ListOptions) (*corev1.PodList, error)) cache.ListWithContextFunc {
	return func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		pods, err := list(ctx, opts)
		if err != nil {
			return nil, err
		}
		out := &metainternalversion.List{ListMeta: pods.ListMeta, Items: make([]runtime.Object, len(pods.Items))}
		for i := range pods.Items {
			out.Items[i] = refOf(&pods.Items[i])
		}
		return out, nil
	}
}

// record is one pod as the store sees it.
type record struct {
	uid, namespace, node, serviceAccount string
	phase                                corev1.PodPhase
	// deletion is the pod's deletionTimestamp in Unix seconds, 0 unless
	// it is terminating.
	deletion int64
}

// live reports whether the pod belongs in the index: scheduled and not
// terminal. The watch's field selector already excludes the others; this
// check keeps the store correct without it (fakes, a changed selector).
func (r record) live() bool {
	return r.uid != "" && r.node != "" && r.namespace != "" && r.serviceAccount != "" &&
		r.phase != corev1.PodFailed && r.phase != corev1.PodSucceeded
}

// recordOf accepts what a reflector may hand a store: a pod, a podRef, or a
// tombstone wrapping either.
func recordOf(obj any) (record, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return record{string(o.UID), o.Namespace, o.Spec.NodeName, o.Spec.ServiceAccountName, o.Status.Phase,
			unixOf(o.DeletionTimestamp)}, nil
	case *podRef:
		return record{string(o.UID), o.Namespace, o.NodeName, o.ServiceAccount, o.Phase, unixOf(o.DeletionTimestamp)}, nil
	case cache.DeletedFinalStateUnknown:
		if o.Obj == nil {
			return record{}, fmt.Errorf("podindex: tombstone %q without an object", o.Key)
		}
		return recordOf(o.Obj)
	}
	return record{}, fmt.Errorf("podindex: unexpected object %T", obj)
}

// unixOf returns t in Unix seconds, 0 for nil. (A deletionTimestamp has
// second precision on the wire.)
func unixOf(t *metav1.Time) int64 {
	if t == nil {
		return 0
	}
	return t.Unix()
}

// deletionTime is the inverse of unixOf: the zero time for 0.
func deletionTime(unix int64) time.Time {
	if unix == 0 {
		return time.Time{}
	}
	return time.Unix(unix, 0)
}
