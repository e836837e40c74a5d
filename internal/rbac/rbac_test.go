package rbac

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
)

// cluster answers access reviews with decide, and records what was asked.
func cluster(decide func(*authzv1.ResourceAttributes) (authzv1.SubjectAccessReviewStatus, error)) (*fake.Clientset, *[]authzv1.ResourceAttributes) {
	cs := fake.NewClientset()
	var asked []authzv1.ResourceAttributes
	cs.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		req := a.(k8stesting.CreateAction).GetObject().(*authzv1.SelfSubjectAccessReview).DeepCopy()
		asked = append(asked, *req.Spec.ResourceAttributes)
		st, err := decide(req.Spec.ResourceAttributes)
		if err != nil {
			return true, nil, err
		}
		req.Status = st
		return true, req, nil
	})
	return cs, &asked
}

func TestCheck(t *testing.T) {
	reviews := Permission{Group: "authentication.k8s.io", Resource: "tokenreviews", Verb: "create"}
	attest := Permission{Group: "certificates.k8s.io", Resource: "signers", Verb: "attest",
		Name: "example.com/spiffe", OrNames: []string{"example.com/*"}}
	status := Permission{Group: "certificates.k8s.io", Resource: "podcertificaterequests", Subresource: "status", Verb: "update"}
	configMaps := Permission{Resource: "configmaps", Verb: "get", Name: "istio-ca-root-cert", Namespace: "istio-system"}
	allow := authzv1.SubjectAccessReviewStatus{Allowed: true}
	tests := []struct {
		name   string
		perms  []Permission
		decide func(*authzv1.ResourceAttributes) (authzv1.SubjectAccessReviewStatus, error)
		// wantErr is ErrPermissionDenied, or nil; wantText what the
		// error must say (none: no error).
		wantErr  error
		wantText []string
		// wantAsked is how many reviews were asked.
		wantAsked int
	}{
		{name: "all allowed", perms: []Permission{reviews, status},
			decide:    func(*authzv1.ResourceAttributes) (authzv1.SubjectAccessReviewStatus, error) { return allow, nil },
			wantAsked: 2},
		{name: "denied with the API server's reason", perms: []Permission{reviews},
			decide: func(*authzv1.ResourceAttributes) (authzv1.SubjectAccessReviewStatus, error) {
				return authzv1.SubjectAccessReviewStatus{Reason: "no RBAC policy matched"}, nil
			},
			wantErr:   ErrPermissionDenied,
			wantText:  []string{"RBAC must allow verb create on tokenreviews (group authentication.k8s.io): no RBAC policy matched"},
			wantAsked: 1},
		{name: "evaluation error", perms: []Permission{reviews},
			decide: func(*authzv1.ResourceAttributes) (authzv1.SubjectAccessReviewStatus, error) {
				return authzv1.SubjectAccessReviewStatus{EvaluationError: "webhook down"}, nil
			},
			wantErr: ErrPermissionDenied, wantText: []string{"evaluation error: webhook down"}, wantAsked: 1},
		{name: "every missing permission named, subresource and namespace too", perms: []Permission{status, configMaps, reviews},
			decide: func(ra *authzv1.ResourceAttributes) (authzv1.SubjectAccessReviewStatus, error) {
				return authzv1.SubjectAccessReviewStatus{Allowed: ra.Resource == "tokenreviews"}, nil
			},
			wantErr: ErrPermissionDenied,
			wantText: []string{"verb update on podcertificaterequests/status (group certificates.k8s.io); " +
				`verb get on configmaps, resourceName "istio-ca-root-cert" (group core, namespace istio-system)`},
			wantAsked: 3},
		{name: "another name grants it", perms: []Permission{attest},
			decide: func(ra *authzv1.ResourceAttributes) (authzv1.SubjectAccessReviewStatus, error) {
				return authzv1.SubjectAccessReviewStatus{Allowed: ra.Name == "example.com/*"}, nil
			},
			wantAsked: 2},
		{name: "no name grants it", perms: []Permission{attest},
			decide: func(ra *authzv1.ResourceAttributes) (authzv1.SubjectAccessReviewStatus, error) {
				return authzv1.SubjectAccessReviewStatus{Reason: "asked for " + ra.Name}, nil
			},
			wantErr:   ErrPermissionDenied,
			wantText:  []string{`verb attest on signers, resourceName "example.com/spiffe" or "example.com/*" (group certificates.k8s.io): asked for example.com/spiffe`},
			wantAsked: 2},
		{name: "the name itself asked first", perms: []Permission{attest},
			decide:    func(*authzv1.ResourceAttributes) (authzv1.SubjectAccessReviewStatus, error) { return allow, nil },
			wantAsked: 1},
		{name: "review not asked", perms: []Permission{reviews, status},
			decide: func(*authzv1.ResourceAttributes) (authzv1.SubjectAccessReviewStatus, error) {
				return authzv1.SubjectAccessReviewStatus{}, apierrors.NewServiceUnavailable("try later")
			},
			wantText:  []string{"checking permission verb create on tokenreviews (group authentication.k8s.io): try later"},
			wantAsked: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs, asked := cluster(tc.decide)
			err := Check(t.Context(), cs, tc.perms...)
			if len(tc.wantText) == 0 && err != nil {
				t.Fatalf("Check: %v", err)
			}
			for _, s := range tc.wantText {
				if err == nil || !strings.Contains(err.Error(), s) {
					t.Errorf("Check = %v, want containing %q", err, s)
				}
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("Check = %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr == nil && errors.Is(err, ErrPermissionDenied) {
				t.Errorf("Check = %v: a review that could not be asked is not a denial", err)
			}
			if len(*asked) != tc.wantAsked {
				t.Errorf("asked %d reviews, want %d: %v", len(*asked), tc.wantAsked, *asked)
			}
		})
	}
}

// TestCheckAsksWhatItNames pins the attributes a review carries: the
// API server decides on exactly these.
func TestCheckAsksWhatItNames(t *testing.T) {
	cs, asked := cluster(func(*authzv1.ResourceAttributes) (authzv1.SubjectAccessReviewStatus, error) {
		return authzv1.SubjectAccessReviewStatus{Allowed: true}, nil
	})
	p := Permission{Group: "g", Resource: "r", Subresource: "s", Verb: "v", Namespace: "ns", Name: "n"}
	if err := Check(t.Context(), cs, p); err != nil {
		t.Fatal(err)
	}
	want := []authzv1.ResourceAttributes{{Group: "g", Resource: "r", Subresource: "s", Verb: "v", Namespace: "ns", Name: "n"}}
	if diff := cmp.Diff(want, *asked); diff != "" {
		t.Errorf("asked (-want +got):\n%s", diff)
	}
}
