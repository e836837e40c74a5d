package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
)

// remoteClusterID is the cluster id of the bench's remote cluster.
const remoteClusterID = "bench-remote"

// measureTwoClusters measures what serving a remote cluster costs: a
// second kube-apiserver and etcd (its own service-account signing key) with
// half the ztunnels of the end-to-end runs on nodes of the same names as
// the local ones, a CA serving it with --remote-kubeconfigs, and the
// maximum rate with half the ztunnels in each cluster, interleaved round by
// round with the same CA serving every ztunnel from the local cluster, so
// the two are compared under the same machine conditions. The ratio of
// the medians is the figure; the target is 0.90 or more.
func (b *bench) measureTwoClusters(ctx context.Context, local *controlplane.ControlPlane, fixture []node) (err error) {
	z, ids := b.opts.ztunnels, b.opts.identities
	inRemote := z / 2
	if inRemote == 0 {
		return errors.New("two clusters: need at least 2 ztunnels")
	}
	b.logf("two clusters: starting a second etcd and kube-apiserver, %d of the %d ztunnels in it", inRemote, z)
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	remote, err := controlplane.Start(startCtx, controlplane.Options{WorkDir: filepath.Join(b.workDir, "controlplane-remote")})
	if err != nil {
		return fmt.Errorf("two clusters: %w", err)
	}
	defer func() { err = errors.Join(err, remote.Stop()) }()
	remoteNodes, err := createCluster(startCtx, remote, inRemote, ids)
	if err != nil {
		return fmt.Errorf("two clusters: remote fixture: %w", err)
	}
	onePlan, twoPlan := filepath.Join(b.workDir, "plan-one-cluster.json"), filepath.Join(b.workDir, "plan-two-clusters.json")
	if err := writePlan(onePlan, planOf(fixture, z, ids, "")); err != nil {
		return err
	}
	split := append(planOf(fixture, z-inRemote, ids, ""), planOf(remoteNodes, inRemote, ids, remoteClusterID)...)
	if err := writePlan(twoPlan, split); err != nil {
		return err
	}
	ca, err := b.startCA(startCtx, local, "two-clusters",
		"--cluster-id", caclient.DefaultClusterID, "--remote-kubeconfigs", remoteClusterID+"="+remote.KubeconfigPath())
	if err != nil {
		return fmt.Errorf("two clusters: %w", err)
	}
	defer func() { err = errors.Join(err, ca.Stop()) }()

	window := max(3*time.Second, b.opts.duration/2)
	var one, two []float64
	var errs float64
	for round := range b.opts.twoClusterRounds {
		for _, run := range []struct {
			plan  string
			rates *[]float64
			name  string
		}{{onePlan, &one, "one cluster"}, {twoPlan, &two, "two clusters"}} {
			rate, failed, err := b.maxRateOf(ctx, local, ca, run.plan, window)
			if err != nil {
				return fmt.Errorf("two clusters, round %d, %s: %w", round+1, run.name, err)
			}
			*run.rates = append(*run.rates, rate)
			errs += failed
			b.logf("  round %d, %s: %.0f certs/s, errors %.0f", round+1, run.name, rate, failed)
		}
	}
	m1, m2 := median(one), median(two)
	b.res.set("two_cluster_rounds", len(one))
	b.res.set("two_cluster_one_cluster_certs_per_sec", m1)
	b.res.set("two_cluster_certs_per_sec", m2)
	b.res.set("two_cluster_errors", errs)
	if m1 > 0 {
		b.res.set("two_cluster_rate_ratio", m2/m1)
	}
	b.logf("  median of %d rounds: one cluster %.0f certs/s (%.0f-%.0f), two clusters %.0f certs/s (%.0f-%.0f), ratio %.3f",
		len(one), m1, slices.Min(one), slices.Max(one), m2, slices.Min(two), slices.Max(two), m2/m1)
	return nil
}

// maxRateOf runs the load generator at its maximum rate with plan for
// window after a second's warm-up, and returns its rate and error count.
func (b *bench) maxRateOf(ctx context.Context, cp *controlplane.ControlPlane, ca *cahost.CA, plan string, window time.Duration) (rate, errs float64, err error) {
	r, err := b.runLoadtest(ctx, cp, ca, "--plan", plan, "--duration", window.String(), "--warmup", "1s")
	if err != nil {
		return 0, 0, err
	}
	return r.sum.CertsPerSec, float64(r.sum.Errors), nil
}

// median is the median of v (not empty); v is left as it was.
func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}
