package trust

import (
	"context"
	"errors"
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"

	"github.com/workload-ca/workload-ca/internal/contest"
)

// ErrSkip is returned by Objects.CreateOrGet when there is nothing to
// publish after all (the namespace went away meanwhile): the reconcile is
// ResultSkipped, not an error.
var ErrSkip = errors.New("nothing to publish")

// Objects is how a Writer reads and writes one kind of object; T is its
// pointer type. An object is found by its queue key and its name.
type Objects[T metav1.Object] interface {
	// Content is the roots obj holds.
	Content(obj T) string
	// Cached returns the object from the informer's cache; ok is false
	// when the cache has none.
	Cached(key, name string) (obj T, ok bool, err error)
	// CreateOrGet creates the object with content (carrying Mark). If it
	// exists already (the cache lags behind a create), it returns the live
	// object with ok true, to compare with instead. An error wrapping
	// ErrSkip or ErrRequeue ends the reconcile with ResultSkipped or
	// ResultRequeued.
	CreateOrGet(ctx context.Context, key, name, content string) (obj T, ok bool, err error)
	// Get reads the live object, managed fields included.
	Get(ctx context.Context, key, name string) (T, error)
	// Update writes content over cur (carrying Mark), keeping what others
	// added; an error wrapping ErrRequeue ends the reconcile with
	// ResultRequeued.
	Update(ctx context.Context, cur T, content string) error
}

// WriterConfig configures a Writer.
type WriterConfig[T metav1.Object] struct {
	Kind    Kind
	Objects Objects[T]
	// Labels are the labels every object we publish carries.
	Labels map[string]string
	// LabelsOf, if set, returns the labels of the object named name
	// instead (Labels and more, such as a stage).
	LabelsOf func(name string) map[string]string
	// FieldManager is the field manager of our writes; ContentField the
	// path of the content in managed fields ("data", "root-cert.pem"), to
	// name the other writers of a contested object.
	FieldManager string
	ContentField []string
	// Queue is the run's queue: a deferred repair re-adds its key.
	Queue   workqueue.TypedDelayingInterface[string]
	Options Options
}

// Writer converges published objects to the roots: created when missing,
// updated when their content, its stamp or our labels differ, and
// restored, at most once per repair interval, when another writer changed
// the content we last wrote. A Writer lives as long as one run.
type Writer[T metav1.Object] struct {
	WriterConfig[T]
	written *contest.Tracker
}

// NewWriter returns a Writer for one run.
func NewWriter[T metav1.Object](c WriterConfig[T]) *Writer[T] {
	return &Writer[T]{WriterConfig: c, written: contest.NewTracker(c.Options.Clock, c.Options.RepairInterval)}
}

// id is the key an object is tracked under.
func id(key, name string) string { return key + "/" + name }

// Mark gives obj our stamp of content and our labels, keeping the others.
func (w *Writer[T]) Mark(obj metav1.Object, content string) {
	obj.SetAnnotations(contest.Stamp(obj.GetAnnotations(), content))
	want := w.labels(obj.GetName())
	l := obj.GetLabels()
	if l == nil {
		l = make(map[string]string, len(want))
	}
	maps.Copy(l, want)
	obj.SetLabels(l)
}

// labels are the labels of the object named name.
func (w *Writer[T]) labels(name string) map[string]string {
	if w.LabelsOf != nil {
		return w.LabelsOf(name)
	}
	return w.Labels
}

// Forget drops what the Writer knows of an object that is gone.
func (w *Writer[T]) Forget(key, name string) { w.written.Forget(id(key, name)) }

// Ensure converges the object name of key to content.
func (w *Writer[T]) Ensure(ctx context.Context, key, name, content string) (string, error) {
	tracked := id(key, name)
	cur, ok, err := w.Objects.Cached(key, name)
	if err != nil {
		return ResultError, err
	}
	if !ok {
		if cur, ok, err = w.Objects.CreateOrGet(ctx, key, name, content); !ok {
			if err != nil {
				return failed(err)
			}
			w.written.Wrote(tracked, content)
			return ResultCreated, nil
		}
	}
	have := w.Objects.Content(cur)
	if have == content && HasLabels(cur.GetLabels(), w.labels(name)) && contest.Stamped(cur.GetAnnotations(), content) {
		w.written.Wrote(tracked, content)
		return ResultUnchanged, nil
	}
	if w.written.Edited(tracked, have, cur.GetAnnotations()) {
		return w.repair(ctx, key, name, content)
	}
	if err := w.Objects.Update(ctx, cur, content); err != nil {
		return failed(err)
	}
	w.written.Wrote(tracked, content)
	return ResultUpdated, nil
}

// repair restores our content in the object, which someone else changed
// since we wrote it. If it repaired the object less than the repair
// interval ago, it re-queues the key for when the interval ends instead.
// The other writers are named from the live object's managed fields (the
// cache drops them).
func (w *Writer[T]) repair(ctx context.Context, key, name, content string) (string, error) {
	tracked := id(key, name)
	if wait := w.written.Repair(tracked); wait > 0 {
		w.Queue.AddAfter(key, wait)
		w.Options.Logger.DebugContext(ctx, "roots in the "+w.Kind.Name+" changed again by another writer; restoring them later",
			w.Kind.Key, key, "name", name, "in", wait)
		return ResultDeferred, nil
	}
	live, err := w.Objects.Get(ctx, key, name)
	if err != nil {
		return failed(err)
	}
	writers := contest.Writers(live, w.FieldManager, w.ContentField...)
	if len(writers) == 0 {
		writers = []string{"unknown"}
	}
	w.Options.Logger.WarnContext(ctx, "another writer changed the roots in the "+w.Kind.Name+"; restoring them (is another publisher of it, such as istiod's, running?)",
		w.Kind.Key, key, "name", name, "writers", writers, "nextRepairAfter", w.Options.RepairInterval)
	live.SetManagedFields(nil) // unchanged: the API server keeps tracking them
	if err := w.Objects.Update(ctx, live, content); err != nil {
		return failed(err)
	}
	w.written.Wrote(tracked, content)
	return ResultRepaired, nil
}

// failed is the result of a reconcile that ended with err.
func failed(err error) (string, error) {
	switch {
	case errors.Is(err, ErrSkip):
		return ResultSkipped, nil
	case errors.Is(err, ErrRequeue):
		return ResultRequeued, err
	}
	return ResultError, err
}
