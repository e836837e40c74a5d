package istiodcert

import "github.com/workload-ca/workload-ca/internal/rbac"

// permissions is what the publisher needs in istiod's namespace. Create is
// checked without a name: the apiserver cannot restrict create by
// resourceNames.
func permissions(ns, name string) []rbac.Permission {
	named := func(verb string) rbac.Permission {
		return rbac.Permission{Resource: "secrets", Verb: verb, Namespace: ns, Name: name}
	}
	return []rbac.Permission{
		named("get"), named("list"), named("watch"), named("update"),
		{Resource: "secrets", Verb: "create", Namespace: ns},
	}
}
