package clustertrustbundle

import (
	"strings"

	"github.com/workload-ca/workload-ca/internal/rbac"
)

const certificatesGroup = "certificates.k8s.io"

// permissions is what the publisher needs: to manage ClusterTrustBundles,
// and to attest for each signer it publishes, which the API server's
// ClusterTrustBundleAttest admission plugin accepts for the signer's name
// or for "<domain>/*".
func permissions(signers []string) []rbac.Permission {
	var perms []rbac.Permission
	for _, verb := range []string{"get", "list", "watch", "create", "update", "delete"} {
		perms = append(perms, rbac.Permission{Group: certificatesGroup, Resource: "clustertrustbundles", Verb: verb})
	}
	for _, s := range signers {
		domain, _, _ := strings.Cut(s, "/")
		perms = append(perms, rbac.Permission{Group: certificatesGroup, Resource: "signers", Verb: "attest",
			Name: s, OrNames: []string{domain + "/*"}})
	}
	return perms
}
