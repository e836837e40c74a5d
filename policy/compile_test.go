package policy

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestCompile(t *testing.T) {
	tests := []struct {
		name    string
		spec    Spec
		wantErr string // a part of the error; empty: it compiles
	}{
		{name: "empty selects everything", spec: Spec{}},
		{name: "every field", spec: Spec{Match: Match{Doors: []string{"grpc"}, Clusters: []string{"c1"}, Identities: []string{"spiffe://td/ns/*/sa/*"},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}},
			MatchConditions: []MatchCondition{{Name: "x", Expression: "namespaceLabels['a'] == 'b'"}},
			Validations:     []Validation{{Expression: "identity.startsWith('spiffe://td/')"}}, MaxTTL: "duration('1h')"}},
		{name: "a syntax error", spec: Spec{Validations: []Validation{{Expression: "a ==="}}}, wantErr: "validations[0]: ERROR"},
		{name: "an unknown variable", spec: Spec{Validations: []Validation{{Expression: "identityServiceAcount == 'x'"}}}, wantErr: "undeclared reference to 'identityServiceAcount'"},
		{name: "a validation that is not a bool", spec: Spec{Validations: []Validation{{Expression: "identityNamespace"}}}, wantErr: "yields string, not bool"},
		{name: "a maxTTL that is not a duration", spec: Spec{MaxTTL: "3600"}, wantErr: "maxTTL: yields int, not google.protobuf.Duration"},
		{name: "an unknown door", spec: Spec{Match: Match{Doors: []string{"http"}}}, wantErr: `"http" is not a door`},
		{name: "a bad pattern", spec: Spec{Match: Match{Identities: []string{"spiffe://td/["}}}, wantErr: "syntax error in pattern"},
		{name: "a bad selector", spec: Spec{Match: Match{NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}}}, wantErr: "match.namespaceSelector"},
		{name: "too long", spec: Spec{Validations: []Validation{{Expression: "'" + strings.Repeat("a", MaxExpressionLength) + "' != ''"}}}, wantErr: "at most 4096"},
		{name: "too many validations", spec: Spec{Validations: make([]Validation, MaxValidations+1)}, wantErr: "validations: 17, at most 16"},
	}
	c, err := NewCompiler()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := c.Compile(pol("p", tt.spec))
			switch {
			case tt.wantErr == "" && got.Err != nil:
				t.Fatalf("Compile: %v", got.Err)
			case tt.wantErr != "" && (got.Err == nil || !strings.Contains(got.Err.Error(), tt.wantErr)):
				t.Fatalf("Compile: %v, want an error with %q", got.Err, tt.wantErr)
			}
		})
	}
}

// An expression that would run long is stopped by its cost limit, and
// denies.
func TestCostLimit(t *testing.T) {
	c, _ := NewCompiler()
	p := c.Compile(pol("slow", Spec{Validations: []Validation{{Expression: "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, [1,2,3,4,5,6,7,8,9,10].all(e, a+b+c+d+e > 0)))))"}}}))
	if p.Err != nil {
		t.Fatal(p.Err)
	}
	set := NewSet([]*Compiled{p}, SetConfig{Tally: &Tally{}})
	r, id := req("shop", "api", "", "workload")
	_, err := set.Decide(t.Context(), "grpc", r, id)
	if err == nil || !strings.Contains(err.Error(), "cost limit") {
		t.Fatalf("Decide: %v, want the cost limit's denial", err)
	}
}

func FuzzCompile(f *testing.F) {
	f.Add("identityServiceAccount != 'default'", "duration('1h')", "spiffe://td/ns/*/sa/*")
	f.Add("nodeLabels[?'pool'].orValue('') == 'a'", "ttl / 2", "[")
	c, err := NewCompiler()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, validation, maxTTL, identity string) {
		p := c.Compile(pol("fuzz", Spec{Match: Match{Identities: []string{identity}}, Validations: []Validation{{Expression: validation}}, MaxTTL: maxTTL}))
		if p.Err != nil {
			return
		}
		set := NewSet([]*Compiled{p}, SetConfig{Labels: testLabels, Tally: &Tally{}})
		r, id := req("payments", "api", "node-a", "node-agent")
		_, _ = set.Decide(t.Context(), "grpc", r, id)
	})
}

// An expression whose cost is bounded whatever the request runs without
// tracking its cost (which costs more than such an expression); one that
// is not is stopped at MaxCost as it runs.
func TestCostEstimate(t *testing.T) {
	c, _ := NewCompiler()
	for _, tt := range []struct {
		expr    string
		tracked bool
	}{
		{"identityServiceAccount != 'default'", false},
		{"nodeLabels[?'pool'].orValue('') == 'tenant-a' && callerKind != 'workload'", false},
		{"identity.startsWith('spiffe://cluster.local/ns/payments/')", false},
		{"namespaceLabels.all(k, k.startsWith('team'))", true},
		{"namespaceLabels.exists(k, namespaceLabels.exists(j, k + j == 'ab'))", true},
	} {
		p := c.Compile(pol("p", Spec{Validations: []Validation{{Expression: tt.expr}}}))
		if p.Err != nil {
			t.Fatalf("%s: %v", tt.expr, p.Err)
		}
		if tracked := p.validations[0].maxCost == 0; tracked != tt.tracked {
			t.Errorf("%s: cost tracked %v (bound %d), want %v", tt.expr, tracked, p.validations[0].maxCost, tt.tracked)
		}
	}
}
