package podindex

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/workload-ca/workload-ca/authz"
)

// A live ServiceAccountOnNode lookup reads at most lookupMaxPages pages of
// lookupPageSize pods. The field selector names node, service account and
// phase, so every pod the server returns is a match and the first page
// normally decides; further pages are read only because a server may return
// a short (even empty) page with a continue token.
const (
	lookupPageSize = 10
	lookupMaxPages = 3
)

// allowLookup takes a token from the caller's live-lookup budget and from
// the index's. A refusal is an *authz.OverloadError saying when to come
// back: it decides nothing, so it is neither "not found" nor cached, and
// the caller's retry finds the watch caught up or a budget refilled.
// Refusals are logged at most once a second (a flood of misses must not
// flood the log) and counted in Stats.
func (i *Index) allowLookup(caller, kind string, args ...any) error {
	now := i.cfg.Clock.Now()
	own := i.callerBudget(caller)
	switch {
	case !own.AllowN(now, 1):
		return i.refuse(now, own.Limit(), kind+" lookups of "+caller, args)
	case !i.limiter.AllowN(now, 1):
		return i.refuse(now, i.limiter.Limit(), kind+" lookups", args)
	}
	i.lookups.Add(1)
	return nil
}

// callerBudget returns the live-lookup limiter of one caller.
func (i *Index) callerBudget(caller string) *rate.Limiter {
	if l, ok := i.callers.Get(caller); ok {
		return l.(*rate.Limiter)
	}
	l := rate.NewLimiter(i.cfg.LookupRatePerCaller, i.cfg.LookupBurstPerCaller)
	i.callers.Add(caller, l)
	return l
}

func (i *Index) refuse(now time.Time, r rate.Limit, what string, args []any) error {
	refused := i.refused.Add(1)
	if i.logOnce.AllowN(now, 1) {
		args = append(args[:len(args):len(args)], "refusedTotal", refused)
		i.cfg.Logger.Warn("podindex: live lookup refused: budget of "+what+" spent", args...)
	}
	retry := time.Second
	if r > 0 {
		retry = max(time.Duration(float64(time.Second)/float64(r)), 100*time.Millisecond)
	}
	return fmt.Errorf("podindex: %w", &authz.OverloadError{RetryAfter: retry, Detail: "budget of live " + what + " spent"})
}

// lookupPod reads namespace/name from the API and checks that it is the
// live, scheduled pod uid. The pod is not added to the index.
func (i *Index) lookupPod(ctx context.Context, namespace, name, uid string) (authz.PodInfo, bool, error) {
	if namespace == "" || name == "" || uid == "" {
		return authz.PodInfo{}, false, nil
	}
	if err := i.allowLookup("namespace/"+namespace, "pod", "namespace", namespace, "name", name, "uid", uid); err != nil {
		return authz.PodInfo{}, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, i.cfg.LookupTimeout)
	defer cancel()
	pod, err := i.cfg.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return authz.PodInfo{}, false, nil
	case err != nil:
		return authz.PodInfo{}, false, fmt.Errorf("podindex: get pod %s/%s: %w: %w",
			namespace, name, authz.ErrUnavailable, err)
	}
	r, _ := recordOf(pod)
	if r.uid != uid || !r.live() {
		return authz.PodInfo{}, false, nil
	}
	return authz.PodInfo{UID: r.uid, NodeName: r.node, ServiceAccount: r.serviceAccount, Deletion: deletionTime(r.deletion)}, true, nil
}

// lookupOnNode lists the namespace's live pods of serviceAccount on node.
func (i *Index) lookupOnNode(ctx context.Context, node, namespace, serviceAccount string) (bool, error) {
	if node == "" || namespace == "" || serviceAccount == "" {
		return false, nil // an empty node would select unscheduled pods
	}
	args := []any{"node", node, "namespace", namespace, "serviceAccount", serviceAccount}
	if err := i.allowLookup("node/"+node, "service-account-on-node", args...); err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, i.cfg.LookupTimeout)
	defer cancel()
	opts := metav1.ListOptions{FieldSelector: onNodeSelector(node, serviceAccount), Limit: lookupPageSize}
	for range lookupMaxPages {
		pods, err := i.cfg.Client.CoreV1().Pods(namespace).List(ctx, opts)
		if err != nil {
			return false, fmt.Errorf("podindex: list pods of %s/%s on node %s: %w: %w",
				namespace, serviceAccount, node, authz.ErrUnavailable, err)
		}
		if anyRunsAs(pods.Items, record{namespace: namespace, node: node, serviceAccount: serviceAccount}, i.cfg.Clock.Now()) {
			return true, nil
		}
		if pods.Continue == "" {
			return false, nil
		}
		opts.Continue = pods.Continue
	}
	i.cfg.Logger.Warn("podindex: live service-account-on-node lookup gave up after the page limit; answering not found",
		args...)
	return false, nil
}

func onNodeSelector(node, serviceAccount string) string {
	return fields.AndSelectors(
		fields.OneTermEqualSelector("spec.nodeName", node),
		fields.OneTermEqualSelector("spec.serviceAccountName", serviceAccount),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
	).String()
}

// anyRunsAs checks the server's answer again on the client: a live pod in
// want's namespace, on want's node, running as want's service account, not
// terminating for longer than authz.DeletionGrace at now.
func anyRunsAs(pods []corev1.Pod, want record, now time.Time) bool {
	for j := range pods {
		r, _ := recordOf(&pods[j])
		if r.live() && r.namespace == want.namespace && r.node == want.node && r.serviceAccount == want.serviceAccount &&
			!authz.DeletedLongAgo(deletionTime(r.deletion), now) {
			return true
		}
	}
	return false
}
