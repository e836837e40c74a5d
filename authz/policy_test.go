package authz_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/authz/authztest"
)

func TestPolicyAuthorize(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	pods := &authztest.Pods{}
	pods.Add("istio-system", "zt", authz.PodInfo{UID: "zt-a", NodeName: "node-a", ServiceAccount: "ztunnel"})
	pods.Add("istio-system", "zt-pending", authz.PodInfo{UID: "zt-u", ServiceAccount: "ztunnel"})
	pods.Add("istio-system", "other", authz.PodInfo{UID: "zt-x", NodeName: "node-a", ServiceAccount: "other"})
	pods.Add("demo", "web-1", authz.PodInfo{UID: "web-1", NodeName: "node-a", ServiceAccount: "web"})
	pods.Add("demo", "db-1", authz.PodInfo{UID: "db-1", NodeName: "node-b", ServiceAccount: "db"})
	now := time.Unix(2e9, 0)
	pods.Add("istio-system", "zt-stopping", authz.PodInfo{UID: "zt-s", NodeName: "node-a", ServiceAccount: "ztunnel", Deletion: now.Add(-59 * time.Second)})
	pods.Add("istio-system", "zt-stuck", authz.PodInfo{UID: "zt-t", NodeName: "node-a", ServiceAccount: "ztunnel", Deletion: now.Add(-61 * time.Second)})
	ztunnel := authz.Caller{Namespace: "istio-system", ServiceAccount: "ztunnel", PodName: "zt", PodUID: "zt-a", NodeName: "node-a"}
	web := authz.Caller{Namespace: "demo", ServiceAccount: "web", PodName: "web-1", PodUID: "web-1"}
	with := func(c authz.Caller, f func(*authz.Caller)) authz.Caller { f(&c); return c }
	id := spiffeid.RequireFromString

	tests := []struct {
		name       string
		caller     authz.Caller
		requested  spiffeid.ID
		pods       authz.Pods
		want       spiffeid.ID
		wantReason authz.Reason
		wantErr    error
	}{
		{name: "workload gets its own identity", caller: web, want: id("spiffe://cluster.local/ns/demo/sa/web")},
		{name: "workload may name its own identity", caller: web, requested: id("spiffe://cluster.local/ns/demo/sa/web"), want: id("spiffe://cluster.local/ns/demo/sa/web")},
		{name: "workload may not impersonate", caller: web, requested: id("spiffe://cluster.local/ns/demo/sa/db"), wantReason: authz.ReasonNotNodeAgent},
		{name: "node agent gets its own identity", caller: ztunnel, want: id("spiffe://cluster.local/ns/istio-system/sa/ztunnel")},
		{name: "node agent gets identity with a pod on its node", caller: ztunnel, requested: id("spiffe://cluster.local/ns/demo/sa/web"), want: id("spiffe://cluster.local/ns/demo/sa/web")},
		{name: "node agent denied identity only on another node", caller: ztunnel, requested: id("spiffe://cluster.local/ns/demo/sa/db"), wantReason: authz.ReasonIdentityNotOnNode},
		{name: "node agent denied identity with no pod at all", caller: ztunnel, requested: id("spiffe://cluster.local/ns/demo/sa/nobody"), wantReason: authz.ReasonIdentityNotOnNode},
		{name: "foreign trust domain denied", caller: ztunnel, requested: id("spiffe://evil.example/ns/demo/sa/web"), wantReason: authz.ReasonForeignTrustDomain},
		{name: "foreign trust domain denied for workloads too", caller: web, requested: id("spiffe://evil.example/ns/demo/sa/web"), wantReason: authz.ReasonForeignTrustDomain},
		{name: "identity without ns/sa shape denied", caller: ztunnel, requested: id("spiffe://cluster.local/custom/path"), wantReason: authz.ReasonInvalidIdentity},
		{name: "token not bound to a pod", caller: with(ztunnel, func(c *authz.Caller) { c.PodUID = "" }), requested: id("spiffe://cluster.local/ns/demo/sa/web"), wantReason: authz.ReasonCallerPodMismatch},
		{name: "caller pod gone", caller: with(ztunnel, func(c *authz.Caller) { c.PodUID = "gone" }), requested: id("spiffe://cluster.local/ns/demo/sa/web"), wantReason: authz.ReasonCallerPodMismatch},
		{name: "caller pod runs as another service account", caller: with(ztunnel, func(c *authz.Caller) { c.PodName, c.PodUID = "other", "zt-x" }), requested: id("spiffe://cluster.local/ns/demo/sa/web"), wantReason: authz.ReasonCallerPodMismatch},
		{name: "token node differs from pod node", caller: with(ztunnel, func(c *authz.Caller) { c.NodeName = "node-b" }), requested: id("spiffe://cluster.local/ns/demo/sa/db"), wantReason: authz.ReasonCallerPodMismatch},
		{name: "token without node uses the pod's node", caller: with(ztunnel, func(c *authz.Caller) { c.NodeName = "" }), requested: id("spiffe://cluster.local/ns/demo/sa/web"), want: id("spiffe://cluster.local/ns/demo/sa/web")},
		{name: "unscheduled caller pod", caller: with(ztunnel, func(c *authz.Caller) { c.PodName, c.PodUID, c.NodeName = "zt-pending", "zt-u", "" }), requested: id("spiffe://cluster.local/ns/demo/sa/web"), wantReason: authz.ReasonCallerNodeUnknown},
		{name: "caller pod terminating within the grace", caller: with(ztunnel, func(c *authz.Caller) { c.PodName, c.PodUID = "zt-stopping", "zt-s" }), requested: id("spiffe://cluster.local/ns/demo/sa/web"), want: id("spiffe://cluster.local/ns/demo/sa/web")},
		{name: "caller pod terminating past the grace", caller: with(ztunnel, func(c *authz.Caller) { c.PodName, c.PodUID = "zt-stuck", "zt-t" }), requested: id("spiffe://cluster.local/ns/demo/sa/web"), wantReason: authz.ReasonCallerPodMismatch},
		{name: "namespace Kubernetes cannot hold, refused before any lookup", caller: ztunnel, requested: id("spiffe://cluster.local/ns/Demo/sa/web"), pods: &authztest.Pods{Err: authz.ErrUnavailable}, wantReason: authz.ReasonInvalidIdentity},
		{name: "service account Kubernetes cannot hold, refused before any lookup", caller: ztunnel, requested: id("spiffe://cluster.local/ns/demo/sa/WEB"), pods: &authztest.Pods{Err: authz.ErrUnavailable}, wantReason: authz.ReasonInvalidIdentity},
		{name: "service account with characters Kubernetes refuses", caller: ztunnel, requested: id("spiffe://cluster.local/ns/demo/sa/x_y"), pods: &authztest.Pods{Err: authz.ErrUnavailable}, wantReason: authz.ReasonInvalidIdentity},
		{name: "namespace longer than a label", caller: ztunnel, requested: id("spiffe://cluster.local/ns/" + strings.Repeat("n", 64) + "/sa/web"), pods: &authztest.Pods{Err: authz.ErrUnavailable}, wantReason: authz.ReasonInvalidIdentity},
		{name: "dotted service account name is one Kubernetes holds", caller: ztunnel, requested: id("spiffe://cluster.local/ns/demo/sa/web.v2"), pods: &authztest.Pods{Err: authz.ErrUnavailable}, wantErr: authz.ErrUnavailable},
		{name: "pod lookup failure fails closed", caller: ztunnel, requested: id("spiffe://cluster.local/ns/demo/sa/web"), pods: &authztest.Pods{Err: authz.ErrUnavailable}, wantErr: authz.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.pods
			if p == nil {
				p = pods
			}
			policy, err := authz.NewPolicy(authz.PolicyConfig{
				TrustDomain: td,
				NodeAgents:  []authz.NodeAgent{{Namespace: "istio-system", ServiceAccount: "ztunnel"}},
				Pods:        p,
				Clock:       testingclock.NewFakePassiveClock(now),
			})
			if err != nil {
				t.Fatal(err)
			}
			got, err := policy.Authorize(context.Background(), tt.caller, tt.requested)
			switch {
			case tt.wantReason != "":
				var deny *authz.DenyError
				if !errors.As(err, &deny) || deny.Reason != tt.wantReason {
					t.Fatalf("Authorize() = %v, %v; want denial %q", got, err, tt.wantReason)
				}
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Authorize() error = %v, want %v", err, tt.wantErr)
				}
			case err != nil:
				t.Fatalf("Authorize() error = %v", err)
			case got != tt.want:
				t.Fatalf("Authorize() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestParseNodeAgent(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    authz.NodeAgent
		wantErr bool
	}{
		{in: "istio-system/ztunnel", want: authz.NodeAgent{Namespace: "istio-system", ServiceAccount: "ztunnel"}},
		{in: "ztunnel", wantErr: true},
		{in: "/ztunnel", wantErr: true},
		{in: "istio-system/", wantErr: true},
		{in: "a/b/c", wantErr: true},
	} {
		got, err := authz.ParseNodeAgent(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseNodeAgent(%q) = %v, %v", tt.in, got, err)
		}
	}
}
