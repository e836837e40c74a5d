package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/policy"
	"github.com/workload-ca/workload-ca/policy/watch"
)

// measurePolicies compares the maximum rate of a CA deciding by 0, 1 and
// 50 issuance policies, round by round, interleaved. The one policy
// selects every request (a validation and a lifetime cap); the fifty add
// 49 that the CA must rule out per request: 24 by a namespace selector
// and 25 by a CEL match condition. The target: fifty cost at most 5% of
// the rate with none.
func (b *bench) measurePolicies(ctx context.Context, cp *controlplane.ControlPlane, plan string) error {
	dyn, err := dynamic.NewForConfig(cp.RESTConfig())
	if err != nil {
		return err
	}
	if err := cp.InstallCRD(ctx, b.opts.policyCRD); err != nil {
		return fmt.Errorf("policies: %w", err)
	}
	client := dyn.Resource(watch.GVR)
	window := max(3*time.Second, b.opts.duration/2)
	measure := func(n int) func() (float64, float64, error) {
		return func() (rate, errs float64, err error) {
			names, err := createPolicies(ctx, client, n)
			defer func() { err = errors.Join(err, deletePolicies(context.WithoutCancel(ctx), client, names)) }()
			if err != nil {
				return 0, 0, err
			}
			startCtx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			ca, err := b.startCA(startCtx, cp, "policies", "--issuance-policies")
			if err != nil {
				return 0, 0, err
			}
			rate, errs, err = b.maxRateOf(ctx, cp, ca, plan, window)
			return rate, errs, errors.Join(err, ca.Stop())
		}
	}
	rates, errs, err := b.interleave("policies", b.opts.policyRounds,
		arm{"0 policies", measure(0)}, arm{"1 policy", measure(1)}, arm{"50 policies", measure(50)})
	if err != nil {
		return err
	}
	b.recordComparison("policies_1", "policies_0_certs_per_sec", [][]float64{rates[0], rates[1]}, errs, "0 policies", "1 policy")
	b.recordComparison("policies_50", "policies_0_certs_per_sec", [][]float64{rates[0], rates[2]}, errs, "0 policies", "50 policies")
	b.res.set("policies_errors", errs)
	return nil
}

// benchPolicies are n policies: the first selects every request, the
// others rule themselves out, by namespace label or by expression.
func benchPolicies(n int) []*policy.IssuancePolicy {
	var out []*policy.IssuancePolicy
	for i := range n {
		p := &policy.IssuancePolicy{TypeMeta: metav1.TypeMeta{APIVersion: policy.Group + "/" + policy.Version, Kind: policy.Kind},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%02d", i)}}
		switch {
		case i == 0:
			p.Spec.Validations = []policy.Validation{{Expression: "identityServiceAccount != 'default'", Message: "no default"}}
			p.Spec.MaxTTL = "duration('12h')"
		case i%2 == 1:
			p.Spec.Match.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("team-%d", i)}}
			p.Spec.MaxTTL = "duration('1h')"
		default:
			p.Spec.MatchConditions = []policy.MatchCondition{{Name: "team", Expression: fmt.Sprintf("identityNamespace == 'team-%d'", i)}}
			p.Spec.Validations = []policy.Validation{{Expression: "callerKind == 'node-agent'"}}
		}
		out = append(out, p)
	}
	return out
}

func createPolicies(ctx context.Context, client dynamic.ResourceInterface, n int) ([]string, error) {
	var names []string
	for _, p := range benchPolicies(n) {
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
		if err != nil {
			return names, err
		}
		if _, err := client.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			return names, err
		}
		names = append(names, p.Name)
	}
	return names, nil
}

func deletePolicies(ctx context.Context, client dynamic.ResourceInterface, names []string) error {
	var errs []error
	for _, name := range names {
		errs = append(errs, client.Delete(ctx, name, metav1.DeleteOptions{}))
	}
	return errors.Join(errs...)
}
