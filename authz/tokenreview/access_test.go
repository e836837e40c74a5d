package tokenreview

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	authzv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/workload-ca/workload-ca/internal/rbac"
)

func TestCheckAccess(t *testing.T) {
	tests := []struct {
		name     string
		status   authzv1.SubjectAccessReviewStatus
		apiErr   error
		wantErr  error
		wantText string
	}{
		{name: "allowed", status: authzv1.SubjectAccessReviewStatus{Allowed: true}},
		{
			name:     "denied",
			status:   authzv1.SubjectAccessReviewStatus{Reason: "no RBAC policy matched"},
			wantErr:  rbac.ErrPermissionDenied,
			wantText: "verb create on tokenreviews (group authentication.k8s.io): no RBAC policy matched",
		},
		{
			name:     "denied with evaluation error",
			status:   authzv1.SubjectAccessReviewStatus{EvaluationError: "webhook down"},
			wantErr:  rbac.ErrPermissionDenied,
			wantText: "evaluation error: webhook down",
		},
		{
			name:     "API error",
			apiErr:   apierrors.NewServiceUnavailable("try later"),
			wantText: "checking permission verb create on tokenreviews (group authentication.k8s.io): try later",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			var asked *authzv1.ResourceAttributes
			cs.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
				req := a.(k8stesting.CreateAction).GetObject().(*authzv1.SelfSubjectAccessReview)
				asked = req.Spec.ResourceAttributes
				if tc.apiErr != nil {
					return true, nil, tc.apiErr
				}
				resp := req.DeepCopy()
				resp.Status = tc.status
				return true, resp, nil
			})
			err := CheckAccess(t.Context(), cs)
			want := &authzv1.ResourceAttributes{Group: "authentication.k8s.io", Resource: "tokenreviews", Verb: "create"}
			if diff := cmp.Diff(want, asked); diff != "" {
				t.Errorf("access asked about (-want +got):\n%s", diff)
			}
			switch {
			case tc.wantText == "" && err != nil:
				t.Fatalf("CheckAccess: %v", err)
			case tc.wantText != "" && (err == nil || !strings.Contains(err.Error(), tc.wantText)):
				t.Fatalf("CheckAccess error = %v, want containing %q", err, tc.wantText)
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("CheckAccess error = %v, want %v", err, tc.wantErr)
			}
		})
	}
}
