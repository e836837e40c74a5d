package server

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/ca"
)

// minRetryAfter is the least time an overloaded caller is told to wait.
const minRetryAfter = 100 * time.Millisecond

// errNotReady is returned while the CA cannot serve yet (CA material or pod
// index not ready).
var errNotReady = errors.New("not ready")

// errAuditUnwritable: an issuance's audit record could not be written, so
// the certificate is not handed out.
var errAuditUnwritable = errors.New("audit log unwritable")

// The results of a request, as audit records, logs and metrics label them
// (a small fixed set).
const (
	ResultIssued          = "issued"
	ResultUnauthenticated = "unauthenticated"
	ResultDenied          = "denied"
	ResultInvalid         = "invalid"
	ResultUnavailable     = "unavailable"
	ResultCanceled        = "canceled"
	ResultInternal        = "internal"
)

// outcome classifies an error for the caller, the logs and the metrics. It is
// the one place where errors become gRPC codes.
type outcome struct {
	// retryAfter, for an overload, is when the caller should come back
	// (grpc-retry-pushback-ms and a RetryInfo detail); zero otherwise.
	retryAfter time.Duration
	code       codes.Code
	// result is one of the Result* labels.
	result string
	// reason is the denial reason for denied requests.
	reason authz.Reason
	// message is what the caller is told: little about why auth failed.
	message string
}

// classify maps an error from any layer to its outcome.
func classify(err error) outcome {
	var deny *authz.DenyError
	switch {
	case err == nil:
		return outcome{code: codes.OK, result: ResultIssued}
	case errors.Is(err, authz.ErrUnauthenticated):
		return outcome{code: codes.Unauthenticated, result: ResultUnauthenticated, message: "authentication failed"}
	case errors.As(err, &deny):
		return outcome{code: codes.PermissionDenied, result: ResultDenied, reason: deny.Reason,
			message: "identity not permitted: " + string(deny.Reason)}
	case errors.Is(err, ca.ErrForeignTrustDomain):
		// The policy refuses these first; the signer's own check answers
		// the same way, never Internal.
		return outcome{code: codes.PermissionDenied, result: ResultDenied, reason: authz.ReasonForeignTrustDomain,
			message: "identity not permitted: " + string(authz.ReasonForeignTrustDomain)}
	case errors.Is(err, ca.ErrInvalidCSR), errors.Is(err, errInvalidRequest):
		// The caller's own input: the full message helps them fix it.
		return outcome{code: codes.InvalidArgument, result: ResultInvalid, message: err.Error()}
	case errors.Is(err, authz.ErrOverloaded):
		o := outcome{code: codes.Unavailable, result: ResultUnavailable, reason: "overloaded", message: "certificate authority overloaded, retry later"}
		if oe := (*authz.OverloadError)(nil); errors.As(err, &oe) {
			o.retryAfter = max(oe.RetryAfter, minRetryAfter)
		}
		return o
	case errors.Is(err, errNotReady), errors.Is(err, authz.ErrUnavailable), errors.Is(err, errAuditUnwritable):
		return outcome{code: codes.Unavailable, result: ResultUnavailable, message: "certificate authority temporarily unavailable"}
	case errors.Is(err, context.Canceled):
		return outcome{code: codes.Canceled, result: ResultCanceled, message: "request canceled"}
	case errors.Is(err, context.DeadlineExceeded):
		return outcome{code: codes.DeadlineExceeded, result: ResultCanceled, message: "deadline exceeded"}
	default:
		return outcome{code: codes.Internal, result: ResultInternal, message: "internal error"}
	}
}
