package authz

import (
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestWorkload(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	for _, tc := range []struct {
		path   string
		ns, sa string // empty: not a workload identity
	}{
		{"/ns/demo/sa/web", "demo", "web"},
		{"/ns/a-b/sa/c.d", "a-b", "c.d"},
		{"/ns/a.b/sa/c-d", "", ""}, // a namespace is a DNS-1123 label
		{"/ns/demo/sa/Web", "", ""},
		{"/ns/demo/sa/-web", "", ""},
		{"", "", ""},
		{"/ns", "", ""},
		{"/ns/demo", "", ""},
		{"/ns/demo/sa", "", ""},
		{"/ns/demo/xa/web", "", ""},
		{"/ns/demo/sa/web/x", "", ""},
		{"/nsx/demo/sa/web", "", ""},
		{"/x/ns/demo/sa/web", "", ""},
	} {
		id, err := spiffeid.FromPath(td, tc.path)
		if err != nil {
			t.Fatalf("FromPath(%q): %v", tc.path, err)
		}
		ns, sa, err := workload(id)
		if ns != tc.ns || sa != tc.sa || (err == nil) != (tc.ns != "") {
			t.Errorf("workload(%s) = %q, %q, %v; want %q, %q", id, ns, sa, err, tc.ns, tc.sa)
		}
	}
}

// FuzzWorkload: an identity is read as a workload only when it is exactly
// spiffe://<td>/ns/<namespace>/sa/<service account> with names Kubernetes
// can hold, and the names read back build the same identity.
func FuzzWorkload(f *testing.F) {
	for _, p := range []string{"/ns/demo/sa/web", "/ns/a.b/sa/c", "/ns/x/sa/Y", "/ns//sa/x", "/ns/x/sa/y/z", "/ns/x/sa/y.z-1"} {
		f.Add(p)
	}
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	f.Fuzz(func(t *testing.T, path string) {
		id, err := spiffeid.FromPath(td, path)
		if err != nil {
			return
		}
		ns, sa, err := workload(id)
		if err != nil {
			return
		}
		if len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(sa)) > 0 {
			t.Fatalf("workload(%s) = %q, %q: names Kubernetes cannot hold", id, ns, sa)
		}
		if back, err := WorkloadID(td, ns, sa); err != nil || back != id {
			t.Fatalf("workload(%s) = %q, %q, which build %v, %v", id, ns, sa, back, err)
		}
	})
}
