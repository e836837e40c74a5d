// Package rbac is the CA's one start-up access check: each component lists
// the permissions it needs, and Check asks the API server about each
// (SelfSubjectAccessReview), so that a missing RBAC rule is one clear error
// at start that names every missing permission, rather than a component
// retrying forever or every caller failing.
package rbac

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ErrPermissionDenied is wrapped by Check when RBAC does not grant a
// permission.
var ErrPermissionDenied = errors.New("permission denied")

// Permission is one thing a component does with the API. The empty
// Namespace asks for all namespaces, which only a ClusterRoleBinding
// grants (and is what a cluster-scoped resource is asked with).
type Permission struct {
	Group, Resource, Subresource, Verb string
	Namespace                          string
	// Name, when set, is the only object the permission is needed for, so
	// that a rule restricted by resourceNames passes. Create cannot be
	// restricted by name (the API server authorizes it before the name is
	// known): leave Name empty for it.
	Name string
	// OrNames are names that grant the same as Name (the
	// ClusterTrustBundleAttest admission plugin, for one, accepts a
	// signer's "<domain>/*" too); the permission holds if any is allowed.
	OrNames []string
}

func (p Permission) String() string {
	var b strings.Builder
	b.WriteString("verb " + p.Verb + " on " + p.Resource)
	if p.Subresource != "" {
		b.WriteString("/" + p.Subresource)
	}
	if p.Name != "" {
		b.WriteString(", resourceName " + strconv.Quote(p.Name))
		for _, n := range p.OrNames {
			b.WriteString(" or " + strconv.Quote(n))
		}
	}
	group := p.Group
	if group == "" {
		group = "core"
	}
	b.WriteString(" (group " + group)
	if p.Namespace != "" {
		b.WriteString(", namespace " + p.Namespace)
	}
	b.WriteString(")")
	return b.String()
}

// Check asks whether the client's own identity has every permission. It
// returns an error wrapping ErrPermissionDenied that names each missing
// permission with the API server's reason, or the first review that could
// not be asked.
func Check(ctx context.Context, client kubernetes.Interface, perms ...Permission) error {
	var missing []string
	for _, p := range perms {
		st, err := review(ctx, client, p)
		if err != nil {
			return err
		}
		if !st.Allowed {
			missing = append(missing, p.String()+because(st))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: RBAC must allow %s", ErrPermissionDenied, strings.Join(missing, "; "))
	}
	return nil
}

// review asks about p, then about each of its other names until one is
// allowed; the status returned is the first one's when none is.
func review(ctx context.Context, client kubernetes.Interface, p Permission) (authzv1.SubjectAccessReviewStatus, error) {
	var first authzv1.SubjectAccessReviewStatus
	for i, name := range append([]string{p.Name}, p.OrNames...) {
		ssar := &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authzv1.ResourceAttributes{Namespace: p.Namespace, Group: p.Group,
				Resource: p.Resource, Subresource: p.Subresource, Verb: p.Verb, Name: name},
		}}
		resp, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, ssar, metav1.CreateOptions{})
		if err != nil {
			return first, fmt.Errorf("checking permission %s: %w", p, err)
		}
		if resp.Status.Allowed {
			return resp.Status, nil
		}
		if i == 0 {
			first = resp.Status
		}
	}
	return first, nil
}

// because is the API server's reason for a denial, if it gave one.
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
