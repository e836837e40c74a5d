package watch

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"

	"github.com/workload-ca/workload-ca/policy"
)

// maxConditionMessage bounds a condition's message (a compiler's errors).
const maxConditionMessage = 1024

// writeStatus adds the decisions this replica made since the last write
// to each policy's status, and sets its Compiled condition for its
// generation. A policy whose status is current and that decided nothing
// is not written. Counts that could not be written are kept for the next
// time.
func (w *Watcher) writeStatus(ctx context.Context) {
	taken := w.tally.Take()
	w.mu.Lock()
	compiled := make(map[string]*policy.Compiled, len(w.compiled))
	for _, c := range w.compiled {
		compiled[c.Name] = c
	}
	w.mu.Unlock()
	for name := range taken {
		if _, ok := compiled[name]; !ok {
			delete(taken, name) // the policy is gone
			w.tally.Forget(name)
		}
	}
	for name, c := range compiled {
		add := taken[name]
		if err := w.updateStatus(ctx, c, add); err != nil {
			w.tally.Return(name, add)
			w.cfg.Logger.WarnContext(ctx, "the status of an IssuancePolicy could not be written", "policy", name, "error", err)
		}
	}
}

// updateStatus writes one policy's status, with its decisions plus add.
func (w *Watcher) updateStatus(ctx context.Context, c *policy.Compiled, add policy.Decisions) error {
	client := w.cfg.Policies.Resource(GVR)
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var u *unstructured.Unstructured
		if obj, ok, _ := w.informer.GetStore().GetByKey(c.Name); ok && first {
			u = obj.(*unstructured.Unstructured).DeepCopy()
		} else {
			var err error
			if u, err = client.Get(ctx, c.Name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		first = false
		p, err := toPolicy(u)
		if err != nil {
			return err
		}
		if p.Generation != c.Generation {
			return nil // a newer generation: written once it is compiled
		}
		st := p.Status
		before := st.DeepCopyConditions()
		st.ObservedGeneration = p.Generation
		meta.SetStatusCondition(&st.Conditions, compiledCondition(c))
		st.Decisions.Add(add)
		if add == (policy.Decisions{}) && p.Status.ObservedGeneration == p.Generation && conditionsEqual(before, st.Conditions) {
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
}

func compiledCondition(c *policy.Compiled) metav1.Condition {
	cond := metav1.Condition{Type: policy.ConditionCompiled, Status: metav1.ConditionTrue, Reason: "Compiled",
		Message: "compiled; deciding the requests it selects", ObservedGeneration: c.Generation}
	if c.DryRun {
		cond.Message = "compiled; in dry-run mode, recording what it would refuse"
	}
	if c.Err != nil {
		msg := c.Err.Error()
		if len(msg) > maxConditionMessage {
			msg = msg[:maxConditionMessage] + "..."
		}
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "CompileError",
			fmt.Sprintf("does not compile; refusing, as unavailable, the requests it selects: %s", msg)
	}
	return cond
}

func conditionsEqual(a, b []metav1.Condition) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message || x.ObservedGeneration != y.ObservedGeneration {
			return false
		}
	}
	return true
}
