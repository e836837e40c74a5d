// Command bench measures workload-ca at cluster scale and prints one table,
// also written as JSON (bench-results.json) for comparison between commits.
// `make bench` runs it; every phase is described in measure*.
//
//  1. Crypto floor: what one core can sign in-process (P-256 and RSA-2048
//     CAs), the ceiling the end-to-end rate is compared with. The P-256
//     floor the ratio uses is measured again right before and right after
//     the maximum-rate run and the two averaged, so a machine whose speed
//     drifts (shared or throttled cores) does not skew the ratio.
//  2. End to end: a real kube-apiserver and etcd, `workload-ca serve`, and
//     `workload-ca loadtest` as a separate process acting as many ztunnels;
//     first at the maximum rate (the server's CPU is read from /proc), then
//     open loop at half that rate for latency.
//  3. Cold-start storm: a fresh CA process, every ztunnel asking for all its
//     identities at once, retrying as ztunnel does; TokenReviews counted in
//     the apiserver's audit log, the leader's Lease read before and after,
//     the certificates of each second plotted beside the results; then the
//     storm's connections held open and idle, for the memory they cost.
//     Then the same storm against another fresh CA, with a client that
//     retries at once. --storm-rounds repeats the pair over the same
//     fixtures and reports the medians.
//  4. Pod index at 150,000 pods over 5,000 nodes (podindex benchmarks).
//  5. Start to ready: process start to gRPC SERVING, and to /readyz.
//  6. Two clusters: a second kube-apiserver and etcd as a remote cluster
//     of the CA, and the maximum rate with half the ztunnels in each,
//     interleaved with runs of all of them in the local one (see
//     measureTwoClusters).
//
// By default the CA and the floor run on one half of the machine's CPUs
// and the load generator on the other (--placement split; see placement).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/e2e/internal/proc"
	"github.com/workload-ca/workload-ca/e2e/internal/vaultserver"
)

// options are the command line.
type options struct {
	out                               string
	binary                            string
	ztunnels, identities              int
	stormZtunnels, stormIdentities    int
	stormDeadline                     time.Duration
	stormOnly                         bool
	stormRounds                       int
	duration, warmup                  time.Duration
	halfWarmup                        time.Duration
	floorTime                         time.Duration
	podindex                          bool
	cpuProfile, halfCPUProfile        string
	halfTrace                         string
	idleHeapProfile                   string
	stormCPUProfile                   string
	stormCPUProfileDelay              time.Duration
	stormHeapProfile                  string
	serveArgs                         listFlag
	serveEnv                          listFlag
	stormCompareArgs, stormCompareEnv listFlag
	keep                              bool
	strict                            bool
	placement                         string
	twoClusterRounds                  int
	upstreamRounds                    int
	policyRounds                      int
	policyCRD                         string
	vault                             string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := mainCode(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

func mainCode(ctx context.Context, args []string) int {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&o.out, "out", "bench-results.json", "JSON results file")
	fs.StringVar(&o.binary, "binary", os.Getenv(cahost.EnvBinary), "workload-ca binary (serve and loadtest); default $"+cahost.EnvBinary)
	fs.IntVar(&o.ztunnels, "ztunnels", 20, "ztunnels (nodes) of the end-to-end runs")
	fs.IntVar(&o.identities, "identities", 10, "identities per ztunnel in the end-to-end runs")
	fs.IntVar(&o.stormZtunnels, "storm-ztunnels", 50, "ztunnels of the cold-start storm")
	fs.IntVar(&o.stormIdentities, "storm-identities", 10, "identities per ztunnel in the storm")
	fs.DurationVar(&o.stormDeadline, "storm-deadline", 2*time.Minute, "longest a storm may take")
	fs.IntVar(&o.stormRounds, "storm-rounds", 1, "rounds of the cold-start storms, each a ztunnel-like and an aggressive storm against fresh CAs over the same fixtures; the results are the median with its least and most")
	fs.BoolVar(&o.stormOnly, "storm-only", false, "run only the storms (no crypto floor, pod index or rate runs)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured window of each end-to-end run")
	fs.DurationVar(&o.warmup, "warmup", 3*time.Second, "warm-up of the maximum-rate run")
	fs.DurationVar(&o.halfWarmup, "half-warmup", time.Second, "warm-up of the half-rate run")
	fs.DurationVar(&o.floorTime, "floor-time", 3*time.Second, "how long each crypto floor runs")
	fs.BoolVar(&o.podindex, "podindex", true, "run the pod index benchmarks")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write the server's CPU profile during the maximum-rate run here (serves with --pprof)")
	fs.StringVar(&o.halfCPUProfile, "half-cpuprofile", "", "write the server's CPU profile during the half-rate run here (serves with --pprof)")
	fs.StringVar(&o.halfTrace, "half-trace", "", "write the server's execution trace during the half-rate run here (serves with --pprof)")
	fs.StringVar(&o.stormCPUProfile, "storm-cpuprofile", "", "write the server's CPU profile during the first storm here (from its first request and --storm-cpuprofile-delay, for --duration less 2s)")
	fs.DurationVar(&o.stormCPUProfileDelay, "storm-cpuprofile-delay", 0, "how long after the storm's first request its CPU profile starts (and its heap profile is taken)")
	fs.StringVar(&o.stormHeapProfile, "storm-heap-profile", "", "write the server's heap profile during the first storm here (when its CPU profile starts)")
	fs.StringVar(&o.idleHeapProfile, "idle-heap-profile", "", "write the server's heap profile while the storm's connections are idle here")
	fs.Var(&o.stormCompareArgs, "storm-compare-arg", "a flag of `workload-ca serve` to compare in the ztunnel-like storm (repeat for more): each storm round then runs the ztunnel-like storm with it too (results storm_compare_*); it comes after every --serve-arg, so it wins")
	fs.Var(&o.stormCompareEnv, "storm-compare-env", "KEY=value in the environment of the CA to compare in the storm (repeat for more), as --storm-compare-arg")
	fs.Var(&o.serveEnv, "serve-env", "KEY=value in the environment of every `workload-ca serve` (repeat for more), e.g. GOMEMLIMIT=512MiB as the chart sets it")
	fs.Var(&o.serveArgs, "serve-arg", "an extra flag for every `workload-ca serve` (repeat for more), to compare settings")
	fs.BoolVar(&o.keep, "keep", false, "keep the work dir (logs, audit logs, plans)")
	fs.BoolVar(&o.strict, "strict", false, "exit 1 when a target is missed")
	fs.StringVar(&o.placement, "placement", "split", "split: the CA (and the floor) on one half of the CPUs, the load generator on the other; shared: both anywhere")
	fs.IntVar(&o.twoClusterRounds, "two-cluster-rounds", 3, "rounds of the two-cluster comparison (each a one-cluster and a two-cluster run, interleaved); 0 skips it")
	fs.IntVar(&o.upstreamRounds, "upstream-rounds", 3, "rounds of the upstream comparison (each the CA on its local root and on an intermediate a real Vault issued, interleaved); 0 skips it")
	fs.IntVar(&o.policyRounds, "policy-rounds", 3, "rounds of the issuance policy comparison (each the CA with 0, 1 and 50 policies installed, interleaved); 0 skips it")
	fs.StringVar(&o.policyCRD, "policy-crd", "deploy/charts/workload-ca/crds/workload-ca.io_issuancepolicies.yaml", "the IssuancePolicy CRD the policy comparison installs")
	fs.StringVar(&o.vault, "vault", os.Getenv(vaultserver.EnvBinary), "Vault binary of the upstream comparison; default $"+vaultserver.EnvBinary)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.binary == "" || os.Getenv(controlplane.EnvBinDir) == "" {
		fmt.Fprintf(os.Stderr, "bench: %s and %s must be set: run `make bench`\n", cahost.EnvBinary, controlplane.EnvBinDir)
		return 2
	}
	if o.ztunnels > o.stormZtunnels {
		o.stormZtunnels = o.ztunnels // the fixture has max(ztunnels) nodes either way
	}
	place, err := choosePlacement(o.placement)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	b := &bench{opts: o, place: place, res: results{}, log: os.Stderr}
	b.res.meta()
	b.res.set("placement", place.name)
	if place.server != nil {
		b.res.set("server_cpus", fmt.Sprint(place.server))
		b.res.set("client_cpus", fmt.Sprint(place.client))
	}
	b.logf("%s", place.describe())
	err = b.run(ctx)
	b.res.set("load_avg_1m_end", loadAvg())
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
	}
	rows := b.res.table(o.stormOnly)
	if werr := b.res.write(o.out); werr != nil {
		fmt.Fprintln(os.Stderr, "bench:", werr)
		err = errors.Join(err, werr)
	} else {
		fmt.Fprintf(os.Stderr, "bench: results written to %s\n", o.out)
	}
	switch {
	case err != nil:
		return 1
	case o.strict && rows.missed > 0:
		return 1
	}
	return 0
}

// bench is one run.
type bench struct {
	opts    options
	place   placement
	res     results
	log     io.Writer
	workDir string
	// adminAddr and auditLog are the admin address and the audit log of
	// the running CA.
	adminAddr, auditLog string
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "bench: "+format+"\n", args...)
}

// run runs every phase; a failed phase is reported and the others still
// run where they can.
func (b *bench) run(ctx context.Context) error {
	var errs []error
	if !b.opts.stormOnly {
		b.logf("crypto floor (%v per CA key type)", b.opts.floorTime)
		errs = append(errs, b.measureFloor())
	}
	if b.opts.podindex && !b.opts.stormOnly {
		b.logf("pod index at 150,000 pods over 5,000 nodes")
		errs = append(errs, b.measurePodIndex(ctx))
	}
	if ctx.Err() == nil {
		errs = append(errs, b.endToEnd(ctx))
	}
	return errors.Join(errs...)
}

func (b *bench) measureFloor() error {
	for _, kt := range []struct{ keyType, key string }{{keystore.KeyECDSAP256, "floor"}, {keystore.KeyRSA2048, "floor_rsa2048"}} {
		r, err := b.floor(kt.keyType)
		if err != nil {
			return fmt.Errorf("crypto floor %s: %w", kt.keyType, err)
		}
		b.res.set(kt.key+"_certs_per_sec_per_core", r.perCPUSecond)
		b.res.set(kt.key+"_wall_certs_per_sec", r.perWallSec)
		if kt.key == "floor" { // replaced by the floor around the load, if it runs
			b.res.set("floor_start_certs_per_sec_per_core", r.perCPUSecond)
		}
		b.logf("  %s CA: %.0f certs per CPU-second, %.0f/s on one goroutine (%d certificates)", kt.keyType, r.perCPUSecond, r.perWallSec, r.ops)
	}
	return nil
}

// floor measures the crypto floor of keyType where the CA runs.
func (b *bench) floor(keyType string) (r floorResult, err error) {
	err = proc.RunOnCPUs(b.place.server, func() error {
		r, err = measureFloor(keyType, b.opts.floorTime)
		return err
	})
	return r, err
}

// bracketFloor measures the P-256 floor right before the maximum-rate run
// (with the CA started and idle), so the floor the ratio uses is taken
// next to the load it is compared with, not minutes earlier.
func (b *bench) bracketFloor() (float64, error) {
	r, err := b.floor(keystore.KeyECDSAP256)
	if err != nil {
		return 0, fmt.Errorf("crypto floor before the load: %w", err)
	}
	b.res.set("floor_before_certs_per_sec_per_core", r.perCPUSecond)
	b.logf("crypto floor before the load: %.0f certs per CPU-second", r.perCPUSecond)
	return r.perCPUSecond, nil
}

// refloor measures the P-256 floor again, right after the maximum-rate
// run, and sets the floor to the mean of it and before, and the ratio of
// the end-to-end rate per server core to it.
func (b *bench) refloor(before float64) error {
	r, err := b.floor(keystore.KeyECDSAP256)
	if err != nil {
		return fmt.Errorf("crypto floor after the load: %w", err)
	}
	b.res.set("floor_after_certs_per_sec_per_core", r.perCPUSecond)
	floor := (before + r.perCPUSecond) / 2
	b.res.set("floor_certs_per_sec_per_core", floor)
	b.logf("crypto floor after the load: %.0f certs per CPU-second (before it %.0f)", r.perCPUSecond, before)
	if perCore, ok := b.res.num("e2e_certs_per_server_cpu_second"); ok && floor > 0 {
		b.res.set("e2e_ratio_to_floor", perCore/floor)
	}
	return nil
}

// endToEnd starts the control plane and the CA, creates the fixture, and
// runs the load tests and the storm.
func (b *bench) endToEnd(ctx context.Context) (err error) {
	if b.workDir, err = os.MkdirTemp("", "workload-ca-bench-"); err != nil {
		return err
	}
	defer func() {
		if err != nil || b.opts.keep {
			b.logf("work dir kept: %s", b.workDir)
			return
		}
		err = errors.Join(err, os.RemoveAll(b.workDir))
	}()
	b.logf("starting etcd and kube-apiserver")
	// Three minutes, and at least 4ms a pod for the fixture (155,000 pods
	// at 5,000 × 30 take several minutes on two cores).
	pods := b.opts.stormZtunnels * (1 + max(b.opts.identities, b.opts.stormIdentities))
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute+time.Duration(pods)*4*time.Millisecond)
	defer cancel()
	cp, err := controlplane.Start(startCtx, controlplane.Options{WorkDir: filepath.Join(b.workDir, "controlplane")})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cp.Stop()) }()

	nodes := b.opts.stormZtunnels
	ids := max(b.opts.identities, b.opts.stormIdentities)
	b.logf("creating %d nodes, each with a ztunnel and %d workload pods", nodes, ids)
	began := time.Now()
	fixture, err := createCluster(startCtx, cp, nodes, ids)
	if err != nil {
		return err
	}
	b.logf("  created in %v", time.Since(began).Round(time.Millisecond))
	b.res.set("fixture_seconds", time.Since(began).Seconds())
	list, listed, err := listPods(startCtx, cp)
	if err != nil {
		return err
	}
	b.res.set("pods_in_cluster", listed)
	b.res.set("pod_list_seconds", list.Seconds())
	e2ePlan, stormPlan := filepath.Join(b.workDir, "plan-e2e.json"), filepath.Join(b.workDir, "plan-storm.json")
	if err := writePlan(e2ePlan, planOf(fixture, b.opts.ztunnels, b.opts.identities, "")); err != nil {
		return err
	}
	if err := writePlan(stormPlan, planOf(fixture, b.opts.stormZtunnels, b.opts.stormIdentities, "")); err != nil {
		return err
	}

	errs := b.compare(ctx, startCtx, cp, fixture, e2ePlan)
	if ctx.Err() != nil {
		return errors.Join(append(errs, ctx.Err())...)
	}
	// Each storm needs a fresh process: an empty token cache.
	errs = append(errs, b.measureStorms(ctx, cp, stormPlan, b.opts.stormZtunnels*b.opts.stormIdentities))
	return errors.Join(errs...)
}

// compare runs the rate measurements and the interleaved comparisons
// that --storm-only skips.
func (b *bench) compare(ctx, startCtx context.Context, cp *controlplane.ControlPlane, fixture []node, plan string) []error {
	if b.opts.stormOnly {
		return nil
	}
	errs := []error{b.measureRates(ctx, startCtx, cp, plan)}
	if b.opts.twoClusterRounds > 0 && ctx.Err() == nil {
		errs = append(errs, b.measureTwoClusters(ctx, cp, fixture))
	}
	if b.opts.upstreamRounds > 0 && ctx.Err() == nil {
		errs = append(errs, b.measureUpstream(ctx, cp, plan))
	}
	if b.opts.policyRounds > 0 && ctx.Err() == nil {
		errs = append(errs, b.measurePolicies(ctx, cp, plan))
	}
	return errs
}

// measureRates starts the CA and runs the maximum-rate and half-rate load,
// with the crypto floor measured right before and after the first.
func (b *bench) measureRates(ctx, startCtx context.Context, cp *controlplane.ControlPlane, plan string) (err error) {
	ca, err := b.startCA(startCtx, cp, "start")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, ca.Stop()) }()
	before, floorErr := b.bracketFloor()
	errs := []error{floorErr}
	maxRate, err := b.measureMaxRate(ctx, cp, ca, plan)
	errs = append(errs, err)
	if err == nil && floorErr == nil {
		errs = append(errs, b.refloor(before))
	}
	if err == nil && maxRate > 0 {
		errs = append(errs, b.measureHalfRate(ctx, cp, ca, plan, maxRate/2))
	}
	return errors.Join(errs...)
}

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return fmt.Sprint(*l) }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }
