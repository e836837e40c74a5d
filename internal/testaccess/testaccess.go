// Package testaccess answers access reviews in fake clientsets, for the
// unit tests of components that check their permissions at start.
package testaccess

import (
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// AllowAll allows every access review.
func AllowAll(*authzv1.ResourceAttributes) bool { return true }

// Answer makes client answer SelfSubjectAccessReviews with allow (the
// fake's own answer is "denied"), and returns it.
func Answer(client *fake.Clientset, allow func(*authzv1.ResourceAttributes) bool) *fake.Clientset {
	client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		review := a.(k8stesting.CreateAction).GetObject().(*authzv1.SelfSubjectAccessReview).DeepCopy()
		review.Status.Allowed = allow(review.Spec.ResourceAttributes)
		return true, review, nil
	})
	return client
}
