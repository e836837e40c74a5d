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
	rates, errs, err := b.interleave("two clusters", b.opts.twoClusterRounds,
		arm{"one cluster", func() (float64, float64, error) { return b.maxRateOf(ctx, local, ca, onePlan, window) }},
		arm{"two clusters", func() (float64, float64, error) { return b.maxRateOf(ctx, local, ca, twoPlan, window) }})
	if err != nil {
		return err
	}
	b.recordComparison("two_cluster", "two_cluster_one_cluster_certs_per_sec", rates, errs, "one cluster", "two clusters")
	return nil
}

// recordComparison records an interleaved comparison of a base arm and
// another: baseKey the base's median rate, <prefix>_certs_per_sec the
// other's, <prefix>_rate_ratio other over base, <prefix>_rounds and
// <prefix>_errors; and logs the medians with their ranges.
func (b *bench) recordComparison(prefix, baseKey string, rates [][]float64, errs float64, baseName, otherName string) {
	base, other := rates[0], rates[1]
	mb, mo := median(base), median(other)
	b.res.set(prefix+"_rounds", len(base))
	b.res.set(baseKey, mb)
	b.res.set(prefix+"_certs_per_sec", mo)
	b.res.set(prefix+"_errors", errs)
	if mb > 0 {
		b.res.set(prefix+"_rate_ratio", mo/mb)
	}
	b.logf("  median of %d rounds: %s %.0f certs/s (%.0f-%.0f), %s %.0f certs/s (%.0f-%.0f), ratio %.3f",
		len(base), baseName, mb, slices.Min(base), slices.Max(base), otherName, mo, slices.Min(other), slices.Max(other), mo/mb)
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

// arm is one side of an interleaved comparison: its name and one round's
// measurement (rate, errors).
type arm struct {
	name    string
	measure func() (rate, errs float64, err error)
}

// interleave measures each arm once a round, for rounds rounds, in turn
// and in the opposite order every other round (ABBA), so that every arm
// sees the same machine conditions and none always runs first or last (a
// CA started just after the previous one stopped, or after the objects of
// an arm were written, is not at its best); it returns each arm's rates
// and the errors of all.
func (b *bench) interleave(what string, rounds int, arms ...arm) (rates [][]float64, errs float64, err error) {
	rates = make([][]float64, len(arms))
	for round := range rounds {
		for j := range arms {
			i := j
			if round%2 == 1 {
				i = len(arms) - 1 - j
			}
			a := arms[i]
			rate, failed, err := a.measure()
			if err != nil {
				return nil, 0, fmt.Errorf("%s, round %d, %s: %w", what, round+1, a.name, err)
			}
			rates[i] = append(rates[i], rate)
			errs += failed
			b.logf("  round %d, %s: %.0f certs/s, errors %.0f", round+1, a.name, rate, failed)
		}
	}
	return rates, errs, nil
}

// median is the median of v (not empty); v is left as it was.
func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}
