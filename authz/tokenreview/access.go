package tokenreview

import (
	"context"
	"errors"
	"fmt"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ErrPermissionDenied is wrapped by CheckAccess when our identity may not
// create TokenReviews.
var ErrPermissionDenied = errors.New("permission denied")

// CheckAccess asks the apiserver (SelfSubjectAccessReview) whether our own
// identity may create TokenReviews, so a missing RBAC rule shows up at
// startup rather than as every caller failing.
func CheckAccess(ctx context.Context, client kubernetes.Interface) error {
	review := &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authzv1.ResourceAttributes{
			Group:    "authentication.k8s.io",
			Resource: "tokenreviews",
			Verb:     "create",
		},
	}}
	resp, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("checking permission to create tokenreviews: %w", err)
	}
	if st := resp.Status; !st.Allowed {
		return fmt.Errorf("%w: RBAC must allow verb create on tokenreviews (group authentication.k8s.io)%s",
			ErrPermissionDenied, because(st))
	}
	return nil
}

func because(st authzv1.SubjectAccessReviewStatus) string {
	switch {
	case st.Reason != "" && st.EvaluationError != "":
		return fmt.Sprintf(": %s (evaluation error: %s)", st.Reason, st.EvaluationError)
	case st.Reason != "":
		return ": " + st.Reason
	case st.EvaluationError != "":
		return ": evaluation error: " + st.EvaluationError
	}
	return ""
}
