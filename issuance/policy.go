package issuance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Policy is the issuance policy: asked of every request the door's rule
// granted, before it is signed. It may refuse the request (a
// *PolicyError) or lower its lifetime.
type Policy interface {
	Decide(ctx context.Context, door string, r *Request, granted spiffeid.ID) (Verdict, error)
}

// Verdict is what the policy decided of a request it let through.
type Verdict struct {
	// MaxTTL, if set, caps the certificate's lifetime from now: it lowers
	// the TTL, never raises it.
	MaxTTL time.Duration
	// Lowered names the policies that lowered the lifetime; WouldDeny
	// those in dry-run mode that would have refused the request. Both
	// are for the audit record.
	Lowered, WouldDeny []string
}

// ReasonPolicyDenied and ReasonPolicyUnavailable are the reasons of a
// request an issuance policy refused, or could not decide.
const (
	ReasonPolicyDenied      = "policy-denied"
	ReasonPolicyUnavailable = "policy-unavailable"
)

// ErrPolicyUnavailable is wrapped by a PolicyError when a policy that
// selects the request cannot decide it: it does not compile, or an input
// it needs (a namespace's labels) is not known now. The request is
// refused until it can.
var ErrPolicyUnavailable = errors.New("issuance policy cannot decide")

// PolicyError is a refusal by an issuance policy, named for the caller's
// operator: a denial, or (wrapping ErrPolicyUnavailable) a policy that
// could not decide.
type PolicyError struct {
	Policy  string
	Message string
	Err     error
}

func (e *PolicyError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("issuance policy %q cannot decide: %s", e.Policy, e.Message)
	}
	return fmt.Sprintf("denied by issuance policy %q: %s", e.Policy, e.Message)
}

func (e *PolicyError) Unwrap() error { return e.Err }
