package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/issuance"
)

type fakeLabels struct {
	namespaces, nodes map[string]map[string]string
	err               error
}

func (f fakeLabels) NamespaceLabels(_, name string) (map[string]string, error) {
	return f.namespaces[name], f.err
}

func (f fakeLabels) NodeLabels(_, name string) (map[string]string, error) {
	return f.nodes[name], f.err
}

var testLabels = fakeLabels{
	namespaces: map[string]map[string]string{"payments": {"team": "payments"}, "tenant-a": {"tenant": "a"}},
	nodes:      map[string]map[string]string{"node-a": {"pool": "tenant-a"}, "node-b": {"pool": "shared"}},
}

func pol(name string, spec Spec) *IssuancePolicy {
	return &IssuancePolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1}, Spec: spec}
}

func req(ns, sa, node string, kind issuance.CallerKind) (*issuance.Request, spiffeid.ID) {
	id := spiffeid.RequireFromPath(spiffeid.RequireTrustDomainFromString("cluster.local"), "/ns/"+ns+"/sa/"+sa)
	return &issuance.Request{Caller: authz.Caller{Namespace: "istio-system", ServiceAccount: "ztunnel", NodeName: node},
		CallerKind: kind, Cluster: "c1", Credential: issuance.CredentialX509SVID, TTL: 24 * time.Hour}, id
}

var (
	capPayments = pol("cap-payments", Spec{Match: Match{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "payments"}}},
		MaxTTL: "duration('1h')"})
	noDefaultSA = pol("no-default-sa", Spec{Validations: []Validation{{Expression: "identityServiceAccount != 'default'", Message: "the default service account gets no identity"}}})
	tenantNodes = pol("tenant-a-nodes", Spec{Match: Match{Doors: []string{"grpc", "podcert"}, Identities: []string{"spiffe://cluster.local/ns/tenant-a/sa/*"}},
		Validations: []Validation{{Expression: "callerKind != 'workload' && nodeLabels[?'pool'].orValue('') == 'tenant-a'", Message: "tenant-a is served on its own nodes"}}})
	dryRunDefault = pol("dry-default", Spec{DryRun: true, Validations: []Validation{{Expression: "identityServiceAccount != 'default'"}}})
	broken        = pol("broken", Spec{Match: Match{Clusters: []string{"c1"}}, Validations: []Validation{{Expression: "serviceAccount ==="}}})
)

func TestDecide(t *testing.T) {
	grpc, podcert := issuance.DoorGRPC, issuance.DoorPodCertificate
	tests := []struct {
		name       string
		policies   []*IssuancePolicy
		door       string
		ns, sa     string
		node       string
		kind       issuance.CallerKind
		labels     Labels
		wantErr    error // nil, issuance.ErrPolicyUnavailable, or errDenied
		wantPolicy string
		wantMax    time.Duration
		wantDry    []string
	}{
		{name: "no policy lets everything through", ns: "payments", sa: "api"},
		{name: "a namespace's TTL is capped", policies: []*IssuancePolicy{capPayments}, ns: "payments", sa: "api", wantMax: time.Hour},
		{name: "another namespace's is not", policies: []*IssuancePolicy{capPayments}, ns: "shop", sa: "api"},
		{name: "the default service account is denied", policies: []*IssuancePolicy{noDefaultSA}, ns: "shop", sa: "default", wantErr: errDenied, wantPolicy: "no-default-sa"},
		{name: "through the kubelet's door too", policies: []*IssuancePolicy{noDefaultSA}, door: podcert, kind: issuance.CallerKubelet, ns: "shop", sa: "default", wantErr: errDenied, wantPolicy: "no-default-sa"},
		{name: "a tenant's agent on its node pool", policies: []*IssuancePolicy{tenantNodes}, ns: "tenant-a", sa: "api", node: "node-a", kind: issuance.CallerNodeAgent},
		{name: "a tenant's kubelet on its node pool", policies: []*IssuancePolicy{tenantNodes}, door: podcert, ns: "tenant-a", sa: "api", node: "node-a", kind: issuance.CallerKubelet},
		{name: "a tenant's agent on a shared node", policies: []*IssuancePolicy{tenantNodes}, ns: "tenant-a", sa: "api", node: "node-b", kind: issuance.CallerNodeAgent, wantErr: errDenied, wantPolicy: "tenant-a-nodes"},
		{name: "a tenant's agent on an unlabelled node", policies: []*IssuancePolicy{tenantNodes}, ns: "tenant-a", sa: "api", node: "node-x", kind: issuance.CallerNodeAgent, wantErr: errDenied, wantPolicy: "tenant-a-nodes"},
		{name: "a tenant's workload asking itself", policies: []*IssuancePolicy{tenantNodes}, ns: "tenant-a", sa: "api", node: "node-a", kind: issuance.CallerWorkload, wantErr: errDenied, wantPolicy: "tenant-a-nodes"},
		{name: "node labels unknown: cannot decide", policies: []*IssuancePolicy{tenantNodes}, ns: "tenant-a", sa: "api", node: "node-a", kind: issuance.CallerNodeAgent,
			labels: fakeLabels{err: fmt.Errorf("%w: not synced", issuance.ErrPolicyUnavailable)}, wantErr: issuance.ErrPolicyUnavailable, wantPolicy: "tenant-a-nodes"},
		{name: "namespace labels unknown: cannot decide", policies: []*IssuancePolicy{capPayments}, ns: "payments", sa: "api",
			labels: fakeLabels{err: errors.New("not synced")}, wantErr: issuance.ErrPolicyUnavailable, wantPolicy: "cap-payments"},
		{name: "labels not needed, not looked up", policies: []*IssuancePolicy{noDefaultSA}, ns: "shop", sa: "api", labels: fakeLabels{err: errors.New("not synced")}},
		{name: "dry run records and lets through", policies: []*IssuancePolicy{dryRunDefault}, ns: "shop", sa: "default", wantDry: []string{"dry-default"}},
		{name: "a policy that does not compile refuses what it selects", policies: []*IssuancePolicy{broken}, ns: "shop", sa: "api", wantErr: issuance.ErrPolicyUnavailable, wantPolicy: "broken"},
		{name: "and nothing else", policies: []*IssuancePolicy{pol("broken", Spec{Match: Match{Clusters: []string{"c2"}}, Validations: broken.Spec.Validations})}, ns: "shop", sa: "api"},
		{name: "in dry run, only records", policies: []*IssuancePolicy{pol("broken", Spec{DryRun: true, Validations: broken.Spec.Validations})}, ns: "shop", sa: "api", wantDry: []string{"broken"}},
		{name: "policies in name order, first refusal wins", policies: []*IssuancePolicy{capPayments, noDefaultSA}, ns: "payments", sa: "default", wantErr: errDenied, wantPolicy: "no-default-sa"},
		{name: "the lowest cap wins", policies: []*IssuancePolicy{capPayments, pol("cap-all", Spec{MaxTTL: "duration('30m')"})}, ns: "payments", sa: "api", wantMax: 30 * time.Minute},
		{name: "a failing expression denies", policies: []*IssuancePolicy{pol("strict", Spec{Validations: []Validation{{Expression: "namespaceLabels['absent'] == 'x'"}}})}, ns: "shop", sa: "api", wantErr: errDenied, wantPolicy: "strict"},
		{name: "a match condition narrows", policies: []*IssuancePolicy{pol("agents-only", Spec{MatchConditions: []MatchCondition{{Name: "agent", Expression: "callerKind == 'node-agent'"}}, MaxTTL: "duration('2h')"})},
			ns: "shop", sa: "api", kind: issuance.CallerWorkload},
		{name: "door selection", policies: []*IssuancePolicy{pol("podcert-only", Spec{Match: Match{Doors: []string{"podcert"}}, MaxTTL: "duration('2h')"})}, door: grpc, ns: "shop", sa: "api"},
		{name: "a cap above the lifetime asked for lowers nothing", policies: []*IssuancePolicy{pol("cap-long", Spec{MaxTTL: "duration('48h')"})}, ns: "shop", sa: "api"},
		{name: "a bad identity pattern: the policy selects more, never less", policies: []*IssuancePolicy{pol("bad-pattern", Spec{Match: Match{Identities: []string{"spiffe://cluster.local/ns/[shop/sa/*"}}})},
			ns: "payments", sa: "api", wantErr: issuance.ErrPolicyUnavailable, wantPolicy: "bad-pattern"},
		{name: "an unknown input in a dry-run policy does not make a later failure unavailable",
			policies: []*IssuancePolicy{pol("a-dry", Spec{DryRun: true, Validations: []Validation{{Expression: "nodeLabels['pool'] == 'x'"}}}),
				pol("b-strict", Spec{Validations: []Validation{{Expression: "{'a': 'b'}['c'] == 'd'"}}})},
			ns: "shop", sa: "api", labels: fakeLabels{err: errors.New("not synced")}, wantErr: errDenied, wantPolicy: "b-strict", wantDry: []string{"a-dry"}},
		{name: "a TTL expression from the request", policies: []*IssuancePolicy{pol("half", Spec{MaxTTL: "ttl - ttl"})}, ns: "shop", sa: "api", wantErr: errDenied, wantPolicy: "half"},
	}
	c, err := NewCompiler()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var compiled []*Compiled
			for _, p := range tt.policies {
				compiled = append(compiled, c.Compile(p))
			}
			sortByName(compiled)
			l := tt.labels
			if l == nil {
				l = testLabels
			}
			set := NewSet(compiled, SetConfig{Labels: l, Tally: &Tally{}})
			door, kind := tt.door, tt.kind
			if door == "" {
				door = grpc
			}
			if kind == "" {
				kind = issuance.CallerWorkload
			}
			r, id := req(tt.ns, tt.sa, tt.node, kind)
			v, err := set.Decide(context.Background(), door, r, id)
			checkRefusal(t, err, tt.wantErr, tt.wantPolicy)
			if err == nil && v.MaxTTL != tt.wantMax {
				t.Errorf("MaxTTL = %v, want %v", v.MaxTTL, tt.wantMax)
			}
			if strings.Join(v.WouldDeny, ",") != strings.Join(tt.wantDry, ",") {
				t.Errorf("WouldDeny = %v, want %v", v.WouldDeny, tt.wantDry)
			}
		})
	}
}

var errDenied = errors.New("denied by policy")

func checkRefusal(t *testing.T, err, want error, policy string) {
	t.Helper()
	var pe *issuance.PolicyError
	switch {
	case want == nil && err != nil:
		t.Fatalf("Decide: %v, want it let through", err)
	case want == nil:
		return
	case !errors.As(err, &pe):
		t.Fatalf("Decide: %v, want a policy's refusal", err)
	case pe.Policy != policy:
		t.Errorf("refused by %q, want %q (%v)", pe.Policy, policy, err)
	case errors.Is(want, errDenied) && errors.Is(err, issuance.ErrPolicyUnavailable):
		t.Errorf("Decide: %v, want a denial", err)
	case errors.Is(want, issuance.ErrPolicyUnavailable) && !errors.Is(err, want):
		t.Errorf("Decide: %v, want unavailable", err)
	}
	o := issuance.Classify(context.Background(), err)
	if errors.Is(want, errDenied) && (o.Result != issuance.ResultDenied || o.Reason != issuance.ReasonPolicyDenied) {
		t.Errorf("classified %+v", o)
	}
}

func TestTally(t *testing.T) {
	c, _ := NewCompiler()
	tally := &Tally{}
	set := NewSet([]*Compiled{c.Compile(capPayments), c.Compile(dryRunDefault), c.Compile(noDefaultSA)}, SetConfig{Labels: testLabels, Tally: tally})
	for _, x := range []struct{ ns, sa string }{{"payments", "api"}, {"payments", "default"}, {"shop", "default"}, {"shop", "api"}} {
		r, id := req(x.ns, x.sa, "", issuance.CallerWorkload)
		_, _ = set.Decide(context.Background(), issuance.DoorGRPC, r, id)
	}
	got := tally.Take()
	want := map[string]Decisions{
		"cap-payments":  {Selected: 2, TTLCapped: 2},
		"dry-default":   {Selected: 4, WouldDeny: 2},
		"no-default-sa": {Selected: 4, Denied: 2},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Take() = %v, want %v", got, want)
	}
	if again := tally.Take(); len(again) != 0 {
		t.Errorf("second Take() = %v, want nothing", again)
	}
}

// countingLabels counts the lookups of a namespace that has no labels.
type countingLabels struct{ namespaces, nodes int }

func (c *countingLabels) NamespaceLabels(string, string) (map[string]string, error) {
	c.namespaces++
	return nil, nil
}

func (c *countingLabels) NodeLabels(string, string) (map[string]string, error) {
	c.nodes++
	return nil, nil
}

// A request looks up its namespace's and node's labels once, however many
// policies read them, even when there are none.
func TestLabelsLookedUpOnce(t *testing.T) {
	c, _ := NewCompiler()
	var ps []*Compiled
	for i := range 10 {
		ps = append(ps, c.Compile(pol(fmt.Sprintf("sel-%d", i), Spec{Match: Match{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "x"}}}})),
			c.Compile(pol(fmt.Sprintf("cel-%d", i), Spec{Validations: []Validation{{Expression: "!('x' in namespaceLabels) && !('y' in nodeLabels)"}}})))
	}
	sortByName(ps)
	l := &countingLabels{}
	r, id := req("shop", "api", "node-a", issuance.CallerNodeAgent)
	if _, err := NewSet(ps, SetConfig{Labels: l, Tally: &Tally{}}).Decide(t.Context(), issuance.DoorGRPC, r, id); err != nil {
		t.Fatal(err)
	}
	if l.namespaces != 2 || l.nodes != 1 {
		// The selectors' set and the expressions' map are kept apart.
		t.Errorf("looked up the namespace %d times and the node %d, want 2 and 1", l.namespaces, l.nodes)
	}
}
