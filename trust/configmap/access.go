package configmap

import "github.com/workload-ca/workload-ca/internal/rbac"

// permissions is what the publisher needs, in all namespaces. Create is
// checked without a name: the apiserver cannot restrict create by
// resourceNames, since the name is not known when it authorizes, so a
// named rule must not pass.
func permissions() []rbac.Permission {
	named := func(verb string) rbac.Permission {
		return rbac.Permission{Resource: "configmaps", Verb: verb, Name: ConfigMapName}
	}
	return []rbac.Permission{
		named("get"), named("list"), named("watch"), named("update"),
		{Resource: "configmaps", Verb: "create"},
		{Resource: "namespaces", Verb: "list"},
		{Resource: "namespaces", Verb: "watch"},
	}
}
