package policy

import (
	"testing"

	"github.com/workload-ca/workload-ca/issuance"
)

// An expression decided without the interpreter decides as the
// interpreter does; one that is not such a comparison is left to it.
func TestStaticAgreesWithCEL(t *testing.T) {
	c, _ := NewCompiler()
	tests := []struct {
		expr   string
		static bool
	}{
		{"identityNamespace == 'payments'", true},
		{"'payments' == identityNamespace", true},
		{"identityServiceAccount != 'default'", true},
		{"identityNamespace == 'payments' && callerKind == 'node-agent' && door != 'podcert'", true},
		{"node == '' && pod == ''", true},
		{"identityNamespace == 'payments' || identityNamespace == 'shop'", false},
		{"identityNamespace.startsWith('pay')", false},
		{"ttl == duration('24h')", false},
		{"namespaceLabels[?'team'].orValue('') == 'x'", false},
		{"identityNamespace == identityServiceAccount", false},
	}
	reqs := []struct{ ns, sa, node string }{{"payments", "api", "node-a"}, {"shop", "default", ""}, {"payments", "default", "node-b"}}
	for _, tt := range tests {
		p := c.Compile(pol("p", Spec{Validations: []Validation{{Expression: tt.expr}}}))
		if p.Err != nil {
			t.Fatalf("%s: %v", tt.expr, p.Err)
		}
		prg := p.validations[0]
		if got := prg.static != nil; got != tt.static {
			t.Errorf("%s: decided without the interpreter %v, want %v", tt.expr, got, tt.static)
		}
		for _, x := range reqs {
			r, id := req(x.ns, x.sa, x.node, issuance.CallerNodeAgent)
			in := newInput(issuance.DoorGRPC, r, id, testLabels, r.TTL)
			got, err := in.eval(t.Context(), prg)
			if err != nil {
				t.Fatalf("%s: %v", tt.expr, err)
			}
			out, _, err := prg.prg.Eval(newInput(issuance.DoorGRPC, r, id, testLabels, r.TTL))
			if err != nil {
				t.Fatalf("%s by the interpreter: %v", tt.expr, err)
			}
			if got != out.Value() {
				t.Errorf("%s for %+v: %v, the interpreter says %v", tt.expr, x, got, out.Value())
			}
		}
	}
}
