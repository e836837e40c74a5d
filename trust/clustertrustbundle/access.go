package clustertrustbundle

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

const certificatesGroup = "certificates.k8s.io"

// checkAccess asks the apiserver (SelfSubjectAccessReview) whether our
// identity has every permission the publisher needs, so that a missing
// RBAC rule is one clear error at start rather than retries forever.
func checkAccess(ctx context.Context, client kubernetes.Interface, signers []string) error {
	var missing []string
	for _, verb := range []string{"get", "list", "watch", "create", "update", "delete"} {
		ok, err := allowed(ctx, client, verb, "clustertrustbundles", "")
		if err != nil {
			return err
		}
		if !ok {
			missing = append(missing, "verb "+verb+" on clustertrustbundles")
		}
	}
	for _, s := range signers {
		ok, err := mayAttest(ctx, client, s)
		if err != nil {
			return err
		}
		if !ok {
			missing = append(missing, fmt.Sprintf("verb attest on signers, resourceName %q", s))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("clustertrustbundle: %w: RBAC must allow, in group %s: %s",
			ErrPermissionDenied, certificatesGroup, strings.Join(missing, "; "))
	}
	return nil
}

// mayAttest checks signer, then "<domain>/*", as the apiserver's
// ClusterTrustBundleAttest admission plugin does.
func mayAttest(ctx context.Context, client kubernetes.Interface, signer string) (bool, error) {
	ok, err := allowed(ctx, client, "attest", "signers", signer)
	if err != nil || ok {
		return ok, err
	}
	domain, _, _ := strings.Cut(signer, "/")
	return allowed(ctx, client, "attest", "signers", domain+"/*")
}

func allowed(ctx context.Context, client kubernetes.Interface, verb, resource, name string) (bool, error) {
	review := &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authzv1.ResourceAttributes{
			Group:    certificatesGroup,
			Resource: resource,
			Verb:     verb,
			Name:     name,
		},
	}}
	resp, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("clustertrustbundle: checking permission %s on %s: %w", verb, resource, err)
	}
	return resp.Status.Allowed, nil
}
