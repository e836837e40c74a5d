package authz

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"
)

// PodInfo is what the policy needs to know about one pod.
type PodInfo struct {
	UID            string
	NodeName       string
	ServiceAccount string
	// Deletion is the pod's deletionTimestamp: zero unless the pod is
	// terminating.
	Deletion time.Time
}

// Pods answers the policy's questions about pods. Implementations consult a
// local index first and may fall back to a bounded live lookup on a miss, so
// a pod created moments ago is not denied because of informer lag.
type Pods interface {
	// Pod returns the live (non-terminal) pod namespace/name if its UID is uid.
	// found is false when there is no such pod; err wraps ErrUnavailable when
	// the question could not be answered.
	Pod(ctx context.Context, namespace, name, uid string) (info PodInfo, found bool, err error)
	// ServiceAccountOnNode reports whether a live pod running as
	// namespace/serviceAccount is scheduled on node.
	ServiceAccountOnNode(ctx context.Context, node, namespace, serviceAccount string) (bool, error)
}

// NodeAgent is a namespace/service account trusted to request the identities
// of workloads on its own node (ztunnel by default).
type NodeAgent struct {
	Namespace      string
	ServiceAccount string
}

func (a NodeAgent) String() string { return a.Namespace + "/" + a.ServiceAccount }

// ParseNodeAgent parses "namespace/serviceaccount".
func ParseNodeAgent(s string) (NodeAgent, error) {
	ns, sa, ok := strings.Cut(s, "/")
	if !ok || ns == "" || sa == "" || strings.Contains(sa, "/") {
		return NodeAgent{}, fmt.Errorf("node agent %q: want namespace/serviceaccount", s)
	}
	return NodeAgent{Namespace: ns, ServiceAccount: sa}, nil
}

// PolicyConfig configures the node-scoped policy.
type PolicyConfig struct {
	TrustDomain spiffeid.TrustDomain
	// NodeAgents may request identities of workloads on their own node.
	NodeAgents []NodeAgent
	Pods       Pods
	// Clock tells when a terminating pod counts as gone; the real clock if
	// nil.
	Clock clock.PassiveClock
}

// Policy is the node-scoped authorization policy.
type Policy struct {
	td     spiffeid.TrustDomain
	agents map[NodeAgent]struct{}
	pods   Pods
	clock  clock.PassiveClock
}

// NewPolicy returns the policy. Pods is required when NodeAgents is set.
func NewPolicy(cfg PolicyConfig) (*Policy, error) {
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("authz: trust domain is required")
	}
	if len(cfg.NodeAgents) > 0 && cfg.Pods == nil {
		return nil, errors.New("authz: node agents need a pod index")
	}
	agents := make(map[NodeAgent]struct{}, len(cfg.NodeAgents))
	for _, a := range cfg.NodeAgents {
		agents[a] = struct{}{}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Policy{td: cfg.TrustDomain, agents: agents, pods: cfg.Pods, clock: cfg.Clock}, nil
}

// Authorize returns the identity the caller gets. A zero requested ID means
// the caller's own identity; any other ID is an impersonation request, which
// only a node agent may make, for a service account with a pod on its node.
func (p *Policy) Authorize(ctx context.Context, c Caller, requested spiffeid.ID) (spiffeid.ID, error) {
	own, err := c.ID(p.td)
	if err != nil {
		return spiffeid.ID{}, Deny(ReasonInvalidIdentity, "caller %s: %v", c, err)
	}
	if requested.IsZero() || requested == own {
		return own, nil
	}
	if requested.TrustDomain() != p.td {
		return spiffeid.ID{}, Deny(ReasonForeignTrustDomain, "%s asked for %s outside trust domain %s", c, requested, p.td)
	}
	if _, ok := p.agents[NodeAgent{Namespace: c.Namespace, ServiceAccount: c.ServiceAccount}]; !ok {
		return spiffeid.ID{}, Deny(ReasonNotNodeAgent, "%s is not a node agent and asked for %s", c, requested)
	}
	ns, sa, err := workload(requested)
	if err != nil {
		return spiffeid.ID{}, Deny(ReasonInvalidIdentity, "%s asked for %s: %v", c, requested, err)
	}
	node, err := p.callerNode(ctx, c)
	if err != nil {
		return spiffeid.ID{}, err
	}
	onNode, err := p.pods.ServiceAccountOnNode(ctx, node, ns, sa)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("pods of %s/%s on node %s: %w", ns, sa, node, err)
	}
	if !onNode {
		return spiffeid.ID{}, Deny(ReasonIdentityNotOnNode, "%s on node %s asked for %s, which has no pod on that node", c, node, requested)
	}
	return requested, nil
}

// callerNode checks that the caller's token is bound to a live pod of the
// caller's service account and returns that pod's node, cross-checked with
// the node the token names. A pod terminating for longer than
// DeletionGrace is no longer live.
func (p *Policy) callerNode(ctx context.Context, c Caller) (string, error) {
	if c.PodName == "" || c.PodUID == "" {
		return "", Deny(ReasonCallerPodMismatch, "%s: token is not bound to a pod", c)
	}
	pod, found, err := p.pods.Pod(ctx, c.Namespace, c.PodName, c.PodUID)
	if err != nil {
		return "", fmt.Errorf("caller pod %s/%s: %w", c.Namespace, c.PodName, err)
	}
	switch {
	case !found:
		return "", Deny(ReasonCallerPodMismatch, "%s: pod uid %s not found", c, c.PodUID)
	case pod.ServiceAccount != c.ServiceAccount:
		return "", Deny(ReasonCallerPodMismatch, "%s: pod runs as %s", c, pod.ServiceAccount)
	case DeletedLongAgo(pod.Deletion, p.clock.Now()):
		return "", Deny(ReasonCallerPodMismatch, "%s: pod has been terminating since %s", c, pod.Deletion.Format(time.RFC3339))
	case pod.NodeName == "":
		return "", Deny(ReasonCallerNodeUnknown, "%s: pod is not scheduled", c)
	case c.NodeName != "" && c.NodeName != pod.NodeName:
		return "", Deny(ReasonCallerPodMismatch, "%s: token names node %s, pod is on %s", c, c.NodeName, pod.NodeName)
	}
	return pod.NodeName, nil
}
