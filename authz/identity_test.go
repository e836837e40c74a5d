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

func TestCallerOwns(t *testing.T) {
	web := Caller{Namespace: "apps", ServiceAccount: "web"}
	tests := []struct {
		name   string
		caller Caller
		id     string
		want   bool
	}{
		{"its own identity", web, "spiffe://cluster.local/ns/apps/sa/web", true},
		{"its own identity in another trust domain", web, "spiffe://other.example/ns/apps/sa/web", true},
		{"another service account", web, "spiffe://cluster.local/ns/apps/sa/db", false},
		{"another namespace", web, "spiffe://cluster.local/ns/app/sa/web", false},
		{"a longer service account name", web, "spiffe://cluster.local/ns/apps/sa/webx", false},
		{"namespace and account swapped", Caller{Namespace: "sa", ServiceAccount: "ns"}, "spiffe://cluster.local/ns/sa/sa/ns", true},
		{"not a workload identity", web, "spiffe://cluster.local/apps/web", false},
		{"a caller without a name", Caller{}, "spiffe://cluster.local/ns/apps/sa/web", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := spiffeid.RequireFromString(tt.id)
			if got := tt.caller.Owns(id); got != tt.want {
				t.Errorf("%+v.Owns(%s) = %v, want %v", tt.caller, id, got, tt.want)
			}
		})
	}
}
