package server

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/issuance"
)

// minRetryAfter is the least time an overloaded caller is told to wait.
const minRetryAfter = 100 * time.Millisecond

// outcome is what the caller is answered: the one place where results
// (issuance.Classify) become gRPC codes and messages.
type outcome struct {
	// retryAfter, for an overload, is when the caller should come back
	// (grpc-retry-pushback-ms and a RetryInfo detail); zero otherwise.
	retryAfter time.Duration
	code       codes.Code
	// result is one of issuance's Result* labels.
	result string
	// reason is the denial reason for denied requests.
	reason authz.Reason
	// message is what the caller is told: little about why auth failed.
	message string
}

// classify maps an error from any layer to its answer: the result
// (issuance.Classify, the one place errors become results) decides the
// code, and the caller is told little about why auth failed.
func classify(ctx context.Context, err error) outcome {
	if err != nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return outcomeOf(issuance.Classify(ctx, err), err)
}

// outcomeOf is the answer to a request that came to io with err.
func outcomeOf(io issuance.Outcome, err error) outcome {
	o := outcome{result: io.Result, reason: authz.Reason(io.Reason)}
	switch io.Result {
	case issuance.ResultIssued:
		o.code = codes.OK
	case issuance.ResultUnauthenticated:
		o.code, o.message = codes.Unauthenticated, "authentication failed"
	case issuance.ResultDenied:
		o.code, o.message = codes.PermissionDenied, "identity not permitted: "+io.Reason
		if pe := (*issuance.PolicyError)(nil); errors.As(err, &pe) {
			// The operator's own policy: its name and message tell
			// the node agent's operator what to change.
			o.message = "identity not permitted: " + pe.Error()
		}
	case issuance.ResultInvalid:
		// The caller's own input: the full message helps them fix it.
		o.code, o.message = codes.InvalidArgument, err.Error()
	case issuance.ResultUnavailable:
		o.code, o.message = codes.Unavailable, "certificate authority temporarily unavailable"
		if pe := (*issuance.PolicyError)(nil); errors.As(err, &pe) {
			o.message = "certificate authority temporarily unavailable: " + pe.Error()
		}
		if io.Reason == issuance.ReasonOverloaded {
			o.message = "certificate authority overloaded, retry later"
			if oe := (*authz.OverloadError)(nil); errors.As(err, &oe) {
				o.retryAfter = max(oe.RetryAfter, minRetryAfter)
			}
		}
	case issuance.ResultCanceled:
		o.code, o.message = codes.Canceled, "request canceled"
		if errors.Is(err, context.DeadlineExceeded) {
			o.code, o.message = codes.DeadlineExceeded, "deadline exceeded"
		}
	default:
		o.code, o.message = codes.Internal, "internal error"
	}
	return o
}

// answer is the code a refusal is answered with, for the audit record.
func answer(io issuance.Outcome, err error) string { return outcomeOf(io, err).code.String() }
