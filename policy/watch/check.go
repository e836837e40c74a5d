package watch

import (
	"context"
	"fmt"

	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/internal/rbac"
	"github.com/workload-ca/workload-ca/policy"
)

// Check tells, before the CA serves, whether the IssuancePolicy resource
// is served and the CA may read the policies, write their status and read
// the namespaces' and nodes' labels: without them no request could be
// decided.
func Check(ctx context.Context, client kubernetes.Interface) error {
	gv := policy.Group + "/" + policy.Version
	list, err := client.Discovery().ServerResourcesForGroupVersion(gv)
	if err != nil {
		return fmt.Errorf("issuance policies: the API server does not serve %s (is the IssuancePolicy CRD installed? the chart's crds/ holds it): %w", gv, err)
	}
	served := false
	for _, r := range list.APIResources {
		served = served || r.Name == policy.Resource
	}
	if !served {
		return fmt.Errorf("issuance policies: the API server serves %s, but not %s", gv, policy.Resource)
	}
	if err := rbac.Check(ctx, client, permissions()...); err != nil {
		return fmt.Errorf("issuance policies: %w", err)
	}
	return nil
}

func permissions() []rbac.Permission {
	return []rbac.Permission{
		{Group: policy.Group, Resource: policy.Resource, Verb: "get"},
		{Group: policy.Group, Resource: policy.Resource, Verb: "list"},
		{Group: policy.Group, Resource: policy.Resource, Verb: "watch"},
		{Group: policy.Group, Resource: policy.Resource, Subresource: "status", Verb: "update"},
		{Resource: "namespaces", Verb: "list"},
		{Resource: "namespaces", Verb: "watch"},
		{Resource: "nodes", Verb: "list"},
		{Resource: "nodes", Verb: "watch"},
	}
}
