package issuance_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/issuance"
	"github.com/workload-ca/workload-ca/policy"
)

// BenchmarkIssueWithPolicies is one node agent's request through the
// pipeline, signed and recorded, with 0, 1 and 50 issuance policies: those
// of make bench (the first selects every request and caps it; of the
// others, half are ruled out by a namespace selector, half by a match
// condition).
func BenchmarkIssueWithPolicies(b *testing.B) {
	authority, err := ca.New(ca.Config{TrustDomain: td}, testca.NewRoot(b, testca.P256).Material())
	if err != nil {
		b.Fatal(err)
	}
	web := spiffeid.RequireFromPath(td, "/ns/apps/sa/web")
	r := issuance.Request{Caller: authz.Caller{Namespace: "istio-system", ServiceAccount: "ztunnel", NodeName: "node-a"},
		CallerKind: issuance.CallerNodeAgent, Requested: web, CSR: csr(b), TTL: 24 * time.Hour}
	compiler, err := policy.NewCompiler()
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{0, 1, 50} {
		var ps []*policy.Compiled
		for i := range n {
			p := &policy.IssuancePolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%02d", i)}}
			switch {
			case i == 0:
				p.Spec.Validations = []policy.Validation{{Expression: "identityServiceAccount != 'default'"}}
				p.Spec.MaxTTL = "duration('12h')"
			case i%2 == 1:
				p.Spec.Match.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("team-%d", i)}}
			default:
				p.Spec.MatchConditions = []policy.MatchCondition{{Name: "team", Expression: fmt.Sprintf("identityNamespace == 'team-%d'", i)}}
			}
			ps = append(ps, compiler.Compile(p))
		}
		cfg := issuance.Config{Signer: authority, Audit: slog.New(slog.NewJSONHandler(io.Discard, nil))}
		if n > 0 {
			cfg.Policy = policy.NewSet(ps, policy.SetConfig{Labels: labels{}, Tally: &policy.Tally{}})
		}
		p, err := issuance.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		d := p.Door(issuance.DoorGRPC, nil)
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := d.Issue(context.Background(), r, grant(web, nil)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type labels struct{}

func (labels) NamespaceLabels(string, string) (map[string]string, error) {
	return map[string]string{"team": "apps"}, nil
}

func (labels) NodeLabels(string, string) (map[string]string, error) { return nil, nil }
