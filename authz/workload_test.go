package authz

import (
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
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
