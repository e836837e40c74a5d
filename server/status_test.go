package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/issuance"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		want       codes.Code
		wantResult string
		// leak is text the caller must not see.
		leak string
	}{
		{name: "success", err: nil, want: codes.OK, wantResult: "issued"},
		{name: "failed authentication", err: fmt.Errorf("review: %w: audience mismatch for pod web-1", authz.ErrUnauthenticated), want: codes.Unauthenticated, wantResult: "unauthenticated", leak: "web-1"},
		{name: "denied identity", err: fmt.Errorf("authorize: %w", authz.Deny(authz.ReasonIdentityNotOnNode, "ztunnel on node-a asked for secret/sa")), want: codes.PermissionDenied, wantResult: "denied", leak: "node-a"},
		{name: "identity outside the signer's trust domain", err: fmt.Errorf("sign: %w: spiffe://evil.example/x", ca.ErrForeignTrustDomain), want: codes.PermissionDenied, wantResult: "denied", leak: "evil.example"},
		{name: "malformed CSR", err: fmt.Errorf("%w: bad signature", ca.ErrInvalidCSR), want: codes.InvalidArgument, wantResult: "invalid"},
		{name: "malformed request", err: fmt.Errorf("%w: metadata", errInvalidRequest), want: codes.InvalidArgument, wantResult: "invalid"},
		{name: "not ready", err: errors.Join(issuance.ErrNotReady, errors.New("pod index not synced")), want: codes.Unavailable, wantResult: "unavailable", leak: "pod index"},
		{name: "kubernetes API down", err: fmt.Errorf("tokenreview: %w: connection refused", authz.ErrUnavailable), want: codes.Unavailable, wantResult: "unavailable", leak: "refused"},
		{name: "client went away", err: fmt.Errorf("review: %w", context.Canceled), want: codes.Canceled, wantResult: "canceled"},
		{name: "deadline", err: fmt.Errorf("review: %w", context.DeadlineExceeded), want: codes.DeadlineExceeded, wantResult: "canceled"},
		{name: "anything else", err: errors.New("signing key gone: /secret/path"), want: codes.Internal, wantResult: "internal", leak: "/secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := classify(context.Background(), tt.err)
			if o.code != tt.want || o.result != tt.wantResult {
				t.Fatalf("classify(%v) = %v/%s, want %v/%s", tt.err, o.code, o.result, tt.want, tt.wantResult)
			}
			if tt.leak != "" && strings.Contains(o.message, tt.leak) {
				t.Fatalf("caller message %q leaks %q", o.message, tt.leak)
			}
		})
	}
}

func TestClassifyDenialCarriesReason(t *testing.T) {
	o := classify(context.Background(), authz.Deny(authz.ReasonNotNodeAgent, "demo/web asked for x"))
	if o.reason != authz.ReasonNotNodeAgent || o.message != "identity not permitted: not-node-agent" {
		t.Fatalf("classify = %+v", o)
	}
}
