package tokenreview

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/workload-ca/workload-ca/authz"
)

// claims are what a service account token carries: the registered claims
// and Kubernetes' private ones.
type claims struct {
	jwt.Claims
	Kubernetes *kubernetesClaims `json:"kubernetes.io"`
}

// kubernetesClaims are the private claims under "kubernetes.io". Only the
// fields of a pod-bound token are named; any other member (a Secret or
// another kind of object the token is bound to, or a member a later
// Kubernetes adds) makes the token one that only a TokenReview decides.
type kubernetesClaims struct {
	Namespace      string     `json:"namespace"`
	ServiceAccount *objectRef `json:"serviceaccount"`
	Pod            *objectRef `json:"pod"`
	Node           *objectRef `json:"node"`
	// WarnAfter only marks a token as stale for the API server's audit
	// log; it never changes whether the token is valid.
	WarnAfter *jwt.NumericDate `json:"warnafter"`
	// Other holds members not named above.
	Other map[string]json.RawMessage `json:"-"`
}

type objectRef struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// UnmarshalJSON decodes the named members and keeps the others in Other.
func (k *kubernetesClaims) UnmarshalJSON(b []byte) error {
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return err
	}
	type named kubernetesClaims
	var n named
	if err := json.Unmarshal(b, &n); err != nil {
		return err
	}
	for _, known := range []string{"namespace", "serviceaccount", "pod", "node", "warnafter"} {
		delete(all, known)
	}
	*k = kubernetesClaims(n)
	if len(all) > 0 {
		k.Other = all
	}
	return nil
}

// ServiceAccounts tells which UID a service account has now; *saindex.Index
// is one.
type ServiceAccounts interface {
	// ServiceAccount returns the UID of namespace/name and its
	// deletionTimestamp (zero unless it is being deleted); ok is false
	// when the index holds no such account.
	ServiceAccount(namespace, name string) (uid string, deletion time.Time, ok bool)
}

// verdict is what local verification decided about a token.
type verdict int

const (
	// undecided: only a TokenReview can tell (another issuer, another kind
	// of token, or a bound object the informers do not show as alive).
	verdictUndecided verdict = iota
	verdictAccepted
	verdictRejected
)

func (v verdict) String() string {
	switch v {
	case verdictAccepted:
		return "accepted"
	case verdictRejected:
		return "rejected"
	}
	return "undecided"
}

// local is a decision about a token with a verified signature.
type local struct {
	verdict verdict
	caller  authz.Caller
	bound   binding
	// flow is the token's share of the TokenReviews, when undecided.
	flow string
	// why explains an undecided or rejected token, for the log.
	why error
}

// decide judges a token whose signature a listed key of the issuer
// verified, as the API server's TokenReview would (pkg/serviceaccount,
// Kubernetes 1.37): a pod-bound token of our issuer, for one of our
// audiences, within its validity (one minute of leeway), whose service
// account has the UID the token names and whose pod is alive, is
// accepted; one of another audience or outside its validity is rejected;
// anything else is undecided. An object deleted more than a minute ago
// counts as gone, as it does for the API server.
func (r *Reviewer) decide(v Verified, issuer string) local {
	var c claims
	if err := json.Unmarshal(v.Payload, &c); err != nil {
		return local{flow: unverifiedFlow, why: fmt.Errorf("claims: %w", err)}
	}
	d := r.decideClaims(c, v.KeyID, issuer)
	d.flow = c.flow()
	return d
}

func (r *Reviewer) decideClaims(c claims, keyID, issuer string) local {
	switch {
	case issuer == "" || c.Issuer != issuer:
		return local{why: fmt.Errorf("issuer %q is not the cluster's (%q)", c.Issuer, issuer)}
	case len(c.Audience) == 0:
		return local{why: errors.New("no audience: a legacy token")}
	}
	now := r.clock.Now()
	if !slices.ContainsFunc(r.audiences, c.Audience.Contains) {
		return local{verdict: verdictRejected, why: fmt.Errorf("token audiences %q include none of %q", []string(c.Audience), r.audiences)}
	}
	// Whether a token is within its validity is the API server's clock's
	// call: a token this replica's clock finds outside it (expired, not
	// valid yet, issued in the future) goes to a TokenReview, so that a
	// replica whose clock was stepped neither refuses good tokens nor
	// accepts expired ones.
	if err := c.ValidateWithLeeway(jwt.Expected{Time: now}, jwt.DefaultLeeway); err != nil {
		return local{why: fmt.Errorf("token %w by this replica's clock", err)}
	}
	k := c.Kubernetes
	switch {
	case k == nil:
		return local{why: errors.New("no kubernetes.io claims")}
	case len(k.Other) > 0:
		return local{why: fmt.Errorf("bound to an object other than a pod (claims %q)", keysOf(k.Other))}
	case k.ServiceAccount == nil || k.Pod == nil || k.Namespace == "" || k.ServiceAccount.Name == "" ||
		k.ServiceAccount.UID == "" || k.Pod.Name == "" || k.Pod.UID == "":
		return local{why: errors.New("not bound to a pod")}
	}
	caller := authz.Caller{Namespace: k.Namespace, ServiceAccount: k.ServiceAccount.Name,
		PodName: k.Pod.Name, PodUID: k.Pod.UID}
	if k.Node != nil {
		caller.NodeName = k.Node.Name
	}
	if c.Expiry != nil {
		caller.ExpiresAt = c.Expiry.Time()
	}
	bound := binding{saUID: k.ServiceAccount.UID, keyID: keyID}
	if err := r.boundAlive(caller, bound, now); err != nil {
		return local{why: err}
	}
	return local{verdict: verdictAccepted, caller: caller, bound: bound}
}

// binding is what a positive answer about a token depends on besides its
// expiry and its pod (caller.PodUID): checked on every cache hit, so that
// the token stops being accepted as soon as the API server would stop
// accepting it.
type binding struct {
	// saUID is the UID of the token's service account ("" if unknown).
	saUID string
	// keyID is the listed key that verified the token ("" if a
	// TokenReview alone did).
	keyID string
}

// boundAlive checks, from the informers, the objects a positive answer
// depends on: the pod by UID, the service account's UID, and the key that
// verified the token, each as alive as the API server requires.
func (r *Reviewer) boundAlive(c authz.Caller, b binding, now time.Time) error {
	if c.PodUID != "" && r.pods != nil {
		deletion, ok := r.pods.IndexedPod(c.Namespace, c.PodUID)
		switch {
		case !ok:
			return fmt.Errorf("pod %s/%s (uid %s) is not in the pod index", c.Namespace, c.PodName, c.PodUID)
		case authz.DeletedLongAgo(deletion, now):
			return fmt.Errorf("pod %s/%s was deleted at %s", c.Namespace, c.PodName, deletion.Format(time.RFC3339))
		}
	}
	if b.saUID != "" && r.accounts != nil {
		uid, deletion, ok := r.accounts.ServiceAccount(c.Namespace, c.ServiceAccount)
		switch {
		case !ok:
			return fmt.Errorf("service account %s/%s is not in the index", c.Namespace, c.ServiceAccount)
		case uid != b.saUID:
			return fmt.Errorf("service account %s/%s has uid %s, the token names %s", c.Namespace, c.ServiceAccount, uid, b.saUID)
		case authz.DeletedLongAgo(deletion, now):
			return fmt.Errorf("service account %s/%s was deleted at %s", c.Namespace, c.ServiceAccount, deletion.Format(time.RFC3339))
		}
	}
	if b.keyID != "" && r.keys != nil && !r.keys.Listed(b.keyID) {
		return fmt.Errorf("key %q is no longer listed by the issuer", b.keyID)
	}
	return nil
}

func keysOf(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// flowOf is the flow of a verified token's claims (see claims.flow).
func flowOf(payload []byte) string {
	var c claims
	if err := json.Unmarshal(payload, &c); err != nil {
		return unverifiedFlow
	}
	return c.flow()
}

// flow is the share of the TokenReviews a token's claims take: the node
// its pod runs on, else its service account, else its subject.
func (c claims) flow() string {
	if k := c.Kubernetes; k != nil {
		switch {
		case k.Node != nil && k.Node.Name != "":
			return "node/" + k.Node.Name
		case k.ServiceAccount != nil && k.Namespace != "":
			return "sa/" + k.Namespace + "/" + k.ServiceAccount.Name
		}
	}
	if c.Subject != "" {
		return "sub/" + c.Subject
	}
	return unverifiedFlow
}
