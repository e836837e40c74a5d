package configmap

import (
	"context"
	"errors"
	"fmt"
	"strings"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ErrPermissionDenied is wrapped by Run when RBAC does not grant what the
// publisher needs (see the package documentation).
var ErrPermissionDenied = errors.New("permission denied")

// permission is one thing the publisher does, in all namespaces.
type permission struct {
	verb, resource string
	// name, when set, is the only object the permission is needed for, so
	// that a rule restricted by resourceNames passes the check.
	name string
}

func (p permission) String() string {
	s := "verb " + p.verb + " on " + p.resource
	if p.name != "" {
		s += " named " + p.name
	}
	return s
}

// requiredPermissions is what the publisher needs. Create is checked
// without a name: the apiserver cannot restrict create by resourceNames,
// since the name is not known when it authorizes, so a named rule must not
// pass.
func requiredPermissions() []permission {
	return []permission{
		{verb: "get", resource: "configmaps", name: ConfigMapName},
		{verb: "list", resource: "configmaps", name: ConfigMapName},
		{verb: "watch", resource: "configmaps", name: ConfigMapName},
		{verb: "update", resource: "configmaps", name: ConfigMapName},
		{verb: "create", resource: "configmaps"},
		{verb: "list", resource: "namespaces"},
		{verb: "watch", resource: "namespaces"},
	}
}

// checkAccess asks the apiserver (SelfSubjectAccessReview) whether our
// identity has every permission the publisher needs, so that a missing
// RBAC rule is one clear error at start rather than retries forever.
func checkAccess(ctx context.Context, client kubernetes.Interface) error {
	var missing []string
	for _, perm := range requiredPermissions() {
		ok, err := allowed(ctx, client, perm)
		if err != nil {
			return err
		}
		if !ok {
			missing = append(missing, perm.String())
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("configmap: %w: RBAC must allow, in the core API group and in all namespaces: %s",
			ErrPermissionDenied, strings.Join(missing, "; "))
	}
	return nil
}

// allowed reviews perm across all namespaces (an empty namespace), which
// only a ClusterRoleBinding grants.
func allowed(ctx context.Context, client kubernetes.Interface, perm permission) (bool, error) {
	review := &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace: metav1.NamespaceAll,
			Group:     "",
			Resource:  perm.resource,
			Verb:      perm.verb,
			Name:      perm.name,
		},
	}}
	resp, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("configmap: checking permission %s: %w", perm, err)
	}
	return resp.Status.Allowed, nil
}
