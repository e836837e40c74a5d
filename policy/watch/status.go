package watch

import (
	"context"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"

	"github.com/workload-ca/workload-ca/issuance"
	"github.com/workload-ca/workload-ca/policy"
)

// maxConditionMessage bounds a condition's message (a compiler's errors).
const maxConditionMessage = 1024

// writeStatus adds the decisions this replica made since the last write
// to each policy's status, and sets its Compiled condition for its
// generation. A policy whose status is current and that decided nothing
// is not written. Counts that could not be written are kept for the next
// time; those of a policy gone are dropped.
func (w *Watcher) writeStatus(ctx context.Context) {
	w.mu.Lock()
	current := slices.Clone(w.current)
	taken := w.tally.Take()
	keys := map[string]bool{}
	for _, c := range current {
		keys[c.Key()] = true
	}
	for key := range taken {
		if !keys[key] {
			w.tally.Forget(key)
		}
	}
	w.mu.Unlock()
	written := make(map[string]int64, len(current))
	for _, c := range current {
		key, add := c.Key(), taken[c.Key()]
		if add == (policy.Decisions{}) && w.written[key] == c.Generation {
			written[key] = c.Generation // nothing to add, its condition current
			continue
		}
		conditionCurrent, err := w.updateStatus(ctx, c, add)
		if err != nil {
			w.tally.Return(key, add)
			w.cfg.Logger.WarnContext(ctx, "the status of an IssuancePolicy could not be written", "policy", c.Name, "error", err)
		}
		if conditionCurrent {
			written[key] = c.Generation
		}
	}
	w.written = written
}

// updateStatus writes one policy's status: its decisions plus add, and,
// if it is still the generation c was compiled from, c's condition
// (current: the condition in the status is c's).
func (w *Watcher) updateStatus(ctx context.Context, c *policy.Compiled, add policy.Decisions) (current bool, _ error) {
	client := w.cfg.Policies.Resource(GVR)
	first := true
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current = false
		var u *unstructured.Unstructured
		if obj, ok, _ := w.informer.GetStore().GetByKey(c.Name); ok && first {
			u = obj.(*unstructured.Unstructured).DeepCopy()
		} else {
			var err error
			if u, err = client.Get(ctx, c.Name, metav1.GetOptions{}); err != nil {
				if apierrors.IsNotFound(err) {
					return nil // gone: its counts with it
				}
				return err
			}
		}
		first = false
		if c.UID != "" && string(u.GetUID()) != c.UID {
			return nil // another policy of the same name: not its counts
		}
		st := statusOf(u)
		changed := add != (policy.Decisions{})
		st.Decisions.Add(add)
		if u.GetGeneration() == c.Generation {
			condChanged := meta.SetStatusCondition(&st.Conditions, compiledCondition(c, w.cfg.Clock.Now()))
			changed = changed || condChanged || st.ObservedGeneration != c.Generation
			st.ObservedGeneration = c.Generation
			current = true
		}
		if !changed {
			return nil
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
		if err != nil {
			return err
		}
		u.Object["status"] = obj
		_, err = client.UpdateStatus(ctx, u, metav1.UpdateOptions{})
		return err
	})
	return current && err == nil, err
}

// statusOf reads a policy's status; what cannot be read starts afresh
// (the CA writes it).
func statusOf(u *unstructured.Unstructured) policy.Status {
	var st policy.Status
	raw, ok, err := unstructured.NestedMap(u.Object, "status")
	if err != nil || !ok {
		return st
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &st); err != nil {
		return policy.Status{}
	}
	return st
}

// compiledCondition is c's Compiled condition; now is its transition
// time, if it is one.
func compiledCondition(c *policy.Compiled, now time.Time) metav1.Condition {
	cond := metav1.Condition{Type: policy.ConditionCompiled, Status: metav1.ConditionTrue, Reason: "Compiled",
		Message: "compiled; deciding the requests it selects", ObservedGeneration: c.Generation,
		LastTransitionTime: metav1.NewTime(now)}
	if c.DryRun {
		cond.Message = "compiled; in dry-run mode, recording what it would refuse"
	}
	if c.Err != nil {
		msg := issuance.Clip(c.Err.Error(), maxConditionMessage)
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "CompileError",
			fmt.Sprintf("does not compile; refusing, as unavailable, the requests it selects: %s", msg)
	}
	return cond
}
