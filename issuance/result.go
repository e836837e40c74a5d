package issuance

import (
	"context"
	"errors"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/ca"
)

// The results of a request, as audit records and metrics label them (a
// small fixed set). Each door answers a result its own way.
const (
	ResultIssued          = "issued"
	ResultUnauthenticated = "unauthenticated"
	ResultDenied          = "denied"
	ResultInvalid         = "invalid"
	ResultUnavailable     = "unavailable"
	ResultCanceled        = "canceled"
	ResultInternal        = "internal"
)

// ReasonOverloaded is the reason of a request refused because the CA is
// overloaded.
const ReasonOverloaded = "overloaded"

var (
	// ErrNotReady means the CA cannot serve yet (its material or an index is not
	// ready).
	ErrNotReady = errors.New("not ready")
	// ErrInvalidRequest is wrapped by every malformed request.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrAuditUnwritable means an issuance's audit record could not be written,
	// so the certificate is not handed out.
	ErrAuditUnwritable = errors.New("audit log unwritable")
	// ErrTooShort means the certificate signed is shorter-lived than the door
	// can hand out (Request.MinValidity), so it is not handed out.
	ErrTooShort = errors.New("certificate too short-lived")
	// ErrPanic wraps a panic in a door or the pipeline.
	ErrPanic = errors.New("panic")
)

// Outcome is what a request came to: a Result* and, for denials and
// overloads, a reason (a small fixed set, safe as a metric label).
type Outcome struct {
	Result string
	Reason string
}

// Classify maps an error from any layer to its outcome; it is the one
// place where errors become results. When ctx has ended and err is not
// nil, the caller went away or its deadline passed: that, not the step it
// cut short, is the outcome.
func Classify(ctx context.Context, err error) Outcome {
	if err == nil {
		// Before the targets of errors.As below, which escape: an
		// issuance allocates nothing here.
		return Outcome{Result: ResultIssued}
	}
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	var deny *authz.DenyError
	var policy *PolicyError
	switch {
	case errors.Is(err, authz.ErrUnauthenticated):
		return Outcome{Result: ResultUnauthenticated}
	case errors.As(err, &policy):
		if errors.Is(err, ErrPolicyUnavailable) {
			return Outcome{Result: ResultUnavailable, Reason: ReasonPolicyUnavailable}
		}
		return Outcome{Result: ResultDenied, Reason: ReasonPolicyDenied}
	case errors.As(err, &deny):
		return Outcome{Result: ResultDenied, Reason: string(deny.Reason)}
	case errors.Is(err, ca.ErrForeignTrustDomain):
		// The node rule refuses these first; the signer's own check
		// answers the same way.
		return Outcome{Result: ResultDenied, Reason: string(authz.ReasonForeignTrustDomain)}
	case errors.Is(err, ca.ErrInvalidCSR), errors.Is(err, ErrInvalidRequest):
		return Outcome{Result: ResultInvalid}
	case errors.Is(err, authz.ErrOverloaded):
		return Outcome{Result: ResultUnavailable, Reason: ReasonOverloaded}
	case errors.Is(err, ErrNotReady), errors.Is(err, authz.ErrUnavailable), errors.Is(err, ErrAuditUnwritable), errors.Is(err, ErrTooShort):
		return Outcome{Result: ResultUnavailable}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Outcome{Result: ResultCanceled}
	default:
		return Outcome{Result: ResultInternal}
	}
}

// summarized reports whether an outcome is a refusal that decides nothing
// about the caller, or one of a caller who did not authenticate: counted
// in a summary, not recorded one by one (see refusals).
func (o Outcome) summarized() bool {
	if o.Reason == ReasonPolicyUnavailable {
		// An operator's policy decided to refuse: recorded as a
		// denial is.
		return false
	}
	return o.Result == ResultUnavailable || o.Result == ResultCanceled || o.Result == ResultUnauthenticated
}
