package tokenreview

import (
	"context"
	"fmt"

	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/internal/rbac"
)

// CheckAccess asks the apiserver whether our own identity may create
// TokenReviews, so a missing RBAC rule shows up at startup rather than as
// every caller failing. A denial wraps rbac.ErrPermissionDenied.
func CheckAccess(ctx context.Context, client kubernetes.Interface) error {
	err := rbac.Check(ctx, client, rbac.Permission{Group: "authentication.k8s.io", Resource: "tokenreviews", Verb: "create"})
	if err != nil {
		return fmt.Errorf("tokenreview: %w", err)
	}
	return nil
}
