package authz

import (
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Caller is an authenticated workload: who presented the bearer token and
// which pod and node the token is bound to.
type Caller struct {
	Namespace      string
	ServiceAccount string
	// PodName and PodUID are set for pod-bound tokens.
	PodName string
	PodUID  string
	// NodeName is the node the pod was bound to when the token was minted;
	// empty for tokens minted before scheduling or by older clusters.
	NodeName string
	// ExpiresAt is the token's expiry (its exp claim), zero if unknown.
	ExpiresAt time.Time
}

// ID is the caller's own SPIFFE ID in trust domain td.
func (c Caller) ID(td spiffeid.TrustDomain) (spiffeid.ID, error) {
	return WorkloadID(td, c.Namespace, c.ServiceAccount)
}

// Owns reports whether id is the caller's own identity,
// spiffe://<id's trust domain>/ns/<namespace>/sa/<service account>,
// without building it: a node agent asks this of every request.
func (c Caller) Owns(id spiffeid.ID) bool {
	p, ns, sa := id.Path(), c.Namespace, c.ServiceAccount
	return ns != "" && sa != "" && len(p) == len("/ns/")+len(ns)+len("/sa/")+len(sa) &&
		p[:len("/ns/")] == "/ns/" && p[len("/ns/"):len("/ns/")+len(ns)] == ns &&
		p[len("/ns/")+len(ns):len("/ns/")+len(ns)+len("/sa/")] == "/sa/" && p[len(p)-len(sa):] == sa
}

// String names the caller for logs: ns/sa (pod).
func (c Caller) String() string {
	if c.PodName == "" {
		return c.Namespace + "/" + c.ServiceAccount
	}
	return c.Namespace + "/" + c.ServiceAccount + " (pod " + c.PodName + ")"
}

// ErrUnauthenticated is wrapped by every authentication failure: a missing,
// malformed, expired, revoked or wrong-audience token.
var ErrUnauthenticated = errors.New("unauthenticated")

// ErrUnavailable is wrapped when a decision cannot be made right now, for
// example because the Kubernetes API cannot be reached. Callers fail closed.
var ErrUnavailable = errors.New("authorization backend unavailable")

// Reason is a machine-readable denial reason, safe to use as a metric label.
type Reason string

// Denial reasons.
const (
	ReasonNotNodeAgent       Reason = "not-node-agent"
	ReasonCallerPodMismatch  Reason = "caller-pod-mismatch"
	ReasonCallerNodeUnknown  Reason = "caller-node-unknown"
	ReasonIdentityNotOnNode  Reason = "identity-not-on-node"
	ReasonForeignTrustDomain Reason = "foreign-trust-domain"
	ReasonInvalidIdentity    Reason = "invalid-identity"
	// ReasonPodMismatch: the pod, node or service account a kubelet's
	// request names is not what the cluster runs.
	ReasonPodMismatch Reason = "pod-mismatch"
)

// DenyError is an authenticated caller asking for an identity it may not
// have. Reason is short and bounded; Detail is the full explanation for logs.
type DenyError struct {
	Reason Reason
	Detail string
}

func (e *DenyError) Error() string {
	if e.Detail == "" {
		return "denied: " + string(e.Reason)
	}
	return fmt.Sprintf("denied: %s: %s", e.Reason, e.Detail)
}

// Deny returns a DenyError with a formatted detail.
func Deny(reason Reason, format string, args ...any) error {
	return &DenyError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// ErrOverloaded is wrapped when a request is refused to keep the CA within
// its capacity. It decides nothing: the caller may come back.
var ErrOverloaded = errors.New("overloaded")

// OverloadError is a refusal for overload that says when the caller
// should come back.
type OverloadError struct {
	// RetryAfter is when a retry has a good chance, from now.
	RetryAfter time.Duration
	// Detail says what was full, for the log.
	Detail string
}

func (e *OverloadError) Error() string { return "overloaded: " + e.Detail }

// Unwrap makes an OverloadError an ErrOverloaded.
func (e *OverloadError) Unwrap() error { return ErrOverloaded }

// MaxTokenSize bounds the bearer tokens the CA accepts, at the gRPC layer
// and in the token checks alike. Projected service account tokens are
// about 1 KiB.
const MaxTokenSize = 8 << 10

// DeletionGrace is how long after an object's deletionTimestamp Kubernetes
// still accepts the tokens bound to it (the API server's JWT leeway,
// pkg/serviceaccount/claims.go); for a pod the timestamp is the delete
// request plus the pod's grace period. A pod terminating for longer counts
// as gone, for its tokens and for the identities it lets a node agent ask
// for.
const DeletionGrace = time.Minute

// DeletedLongAgo reports whether an object marked for deletion at deletion
// (zero: not marked) is gone by now as far as its tokens are concerned.
func DeletedLongAgo(deletion, now time.Time) bool {
	return !deletion.IsZero() && deletion.Before(now.Add(-DeletionGrace))
}
