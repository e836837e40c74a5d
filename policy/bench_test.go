package policy

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/issuance"
)

// BenchmarkDecide is the cost of the policies to one request a node agent
// asks for: none installed, one that selects it, and fifty of which one
// selects it (make bench's policies).
func BenchmarkDecide(b *testing.B) {
	c, _ := NewCompiler()
	for _, n := range []int{0, 1, 50} {
		var ps []*Compiled
		for i := range n {
			// As make bench's: the first selects every request; of the
			// others, half are ruled out by a namespace selector, half
			// by a match condition evaluated per request.
			p := pol(fmt.Sprintf("team-%02d", i), Spec{})
			switch {
			case i == 0:
				p.Spec.Validations = []Validation{{Expression: "identityServiceAccount != 'default'"}}
				p.Spec.MaxTTL = "duration('12h')"
			case i%2 == 1:
				p.Spec.Match.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("team-%02d", i)}}
				p.Spec.MaxTTL = "duration('1h')"
			default:
				p.Spec.MatchConditions = []MatchCondition{{Name: "team", Expression: fmt.Sprintf("identityNamespace == 'team-%d'", i)}}
				p.Spec.Validations = []Validation{{Expression: "callerKind == 'node-agent'"}}
			}
			ps = append(ps, c.Compile(p))
		}
		labels := fakeLabels{namespaces: map[string]map[string]string{"payments": {"team": "team-00"}}}
		set := NewSet(ps, SetConfig{Labels: labels, Tally: &Tally{}})
		r, id := req("payments", "api", "node-a", issuance.CallerNodeAgent)
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := set.Decide(b.Context(), issuance.DoorGRPC, r, id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
