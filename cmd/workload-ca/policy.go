package main

import (
	"context"

	"github.com/workload-ca/workload-ca/internal/component"
	"github.com/workload-ca/workload-ca/issuance"
	"github.com/workload-ca/workload-ca/policy"
	"github.com/workload-ca/workload-ca/policy/watch"
)

// watchPolicies makes every replica decide requests by the issuance
// policies (--issuance-policies): nil without.
func (a *app) watchPolicies(ctx context.Context) (issuance.Policy, error) {
	if !a.cfg.IssuancePolicies {
		return nil, nil
	}
	if err := watch.Check(ctx, a.kube.policyChecks); err != nil {
		return nil, err
	}
	compiler, err := policy.NewCompiler()
	if err != nil {
		return nil, err
	}
	w, err := watch.New(watch.Config{Policies: a.kube.policies, Metadata: a.kube.labels, Cluster: a.cfg.ClusterID,
		Compiler: compiler, Observer: a.metrics, TTL: a.authority.TTL, Logger: a.log.With("component", "policy"), StatusInterval: a.cfg.PolicyStatusInterval})
	if err != nil {
		return nil, err
	}
	a.add(component.Component{Name: "issuance-policies", Run: w.Run, Ready: w.Ready})
	return w, nil
}
