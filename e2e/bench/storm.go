package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/e2e/internal/promserver"
	"github.com/workload-ca/workload-ca/loadtest"
)

// The Lease the bench's CAs lead under (serve's defaults).
const leaseNamespace, leaseName = "istio-system", "workload-ca"

// stormHold is how long the ztunnel-like storm's connections stay open and
// idle after it, for the idle connection memory.
const stormHold = 8 * time.Second

// stormRun is what one cold-start storm measured.
type stormRun struct {
	run           *loadRun
	tokenReviews  int
	leaderChanges int
	serverCPU     float64 // seconds of the CA's CPU; -1 when not known
	// controlCPU is the seconds of CPU the apiserver and etcd took in the
	// storm, which may share the CA's CPUs; -1 when not known.
	controlCPU float64
	rssEnd     float64 // MiB; 0 when not known
	rssPeak    float64
	floor      float64 // certificates per CPU-second around the storm; 0 when not known
}

// seconds is how long the storm took; 0 if it did not finish.
func (r stormRun) seconds() float64 { return r.run.sum.AllDoneSeconds }

// efficiency is the planned certificates' time at the floor over the
// storm's time; 0 when either is not known.
func (r stormRun) efficiency(planned int) float64 {
	if r.floor <= 0 || r.seconds() <= 0 {
		return 0
	}
	return float64(planned) / r.floor / r.seconds()
}

// stormVariant is one kind of storm of each round: the client's retries,
// and the CA's extra serve flags and environment.
type stormVariant struct {
	key       string // prefix of its results
	phase     string // of the CA it runs against (startCA)
	retry     string
	args, env []string
}

// stormVariants are the storms of a round: ztunnel's retries, then a
// client that asks for every identity at once and retries at once; with
// --storm-compare-arg or --storm-compare-env, also ztunnel's retries
// against the CA with those, between the two.
func (b *bench) stormVariants() []stormVariant {
	vs := []stormVariant{{key: "storm_", phase: "restart", retry: loadtest.RetryZtunnel}}
	if len(b.opts.stormCompareArgs) > 0 || len(b.opts.stormCompareEnv) > 0 {
		vs = append(vs, stormVariant{key: "storm_compare_", phase: "restart_compare", retry: loadtest.RetryZtunnel,
			args: b.opts.stormCompareArgs, env: b.opts.stormCompareEnv})
	}
	return append(vs, stormVariant{key: "storm_aggressive_", phase: "restart_aggressive", retry: loadtest.RetryAggressive})
}

// measureStorms runs --storm-rounds rounds of the cold-start storms, each
// storm against a freshly started CA (an empty token cache) and over the
// same fixtures: a round is one storm of each of stormVariants, in turn
// forwards and backwards (ABBA), so that the host's drift falls on both
// alike. The crypto floor is measured before the first storm and after
// each, and a storm's efficiency is against the mean of the floors around
// it. The first round's ztunnel-like storm keeps its connections
// open afterwards, idle, to measure what they cost the CA, and is the one
// profiled.
func (b *bench) measureStorms(ctx context.Context, cp *controlplane.ControlPlane, plan string, planned int) error {
	var errs []error
	before, err := b.floor(keystore.KeyECDSAP256)
	if err != nil {
		return fmt.Errorf("crypto floor before the storms: %w", err)
	}
	variants := b.stormVariants()
	runs := map[string][]stormRun{}
	rounds := max(1, b.opts.stormRounds)
rounds:
	for round := range rounds {
		order := slices.Clone(variants)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, v := range order {
			ca, err := b.startCAWith(ctx, cp, v.phase, v.env, v.args)
			if err != nil {
				errs = append(errs, err)
				break rounds
			}
			b.logf("storm round %d of %d", round+1, rounds)
			s, err := b.measureStorm(ctx, cp, ca, plan, planned, v.retry, round == 0 && v.key == "storm_")
			errs = append(errs, err, ca.Stop())
			if ctx.Err() != nil {
				break rounds
			}
			after, ferr := b.floor(keystore.KeyECDSAP256)
			if ferr != nil {
				errs = append(errs, fmt.Errorf("crypto floor after a storm: %w", ferr))
				break rounds
			}
			if s != nil {
				s.floor = (before.perCPUSecond + after.perCPUSecond) / 2
				b.logf("  crypto floor around it: %.0f certs per CPU-second (before %.0f, after %.0f), efficiency %.2f",
					s.floor, before.perCPUSecond, after.perCPUSecond, s.efficiency(planned))
				runs[v.key] = append(runs[v.key], *s)
			}
			before = after
		}
	}
	errs = append(errs, b.recordStorms(variants, runs, planned))
	return errors.Join(errs...)
}

// recordStorms records the storms of each mode: the median time with its
// least and most, and each round's; the fewest certificates any storm
// issued, every error, the most TokenReviews and every leader change of
// any; the goodput curve, latency, CPU and resident set of the median
// storm, whose curves it also plots.
func (b *bench) recordStorms(variants []stormVariant, runs map[string][]stormRun, planned int) error {
	var curves []curve
	var floors []float64
	for _, v := range variants {
		rs := runs[v.key]
		if len(rs) == 0 {
			continue
		}
		key := v.key
		slices.SortStableFunc(rs, func(a, b stormRun) int { return cmp.Compare(a.seconds(), b.seconds()) })
		mid := rs[(len(rs)-1)/2] // the lower median, a storm that ran
		midSum := mid.run.sum
		seconds := make([]float64, len(rs))
		var efficiency, cpu, control []float64
		certs, errorsSeen, reviews, changes, peak := rs[0].run.sum.Certs, uint64(0), 0, 0, 0.0
		byCode := map[string]uint64{}
		samples := map[string]string{}
		for i, r := range rs {
			seconds[i] = r.seconds()
			if e := r.efficiency(planned); e > 0 {
				efficiency = append(efficiency, e)
				floors = append(floors, r.floor)
			}
			if r.serverCPU >= 0 {
				cpu = append(cpu, r.serverCPU)
			}
			if r.controlCPU >= 0 {
				control = append(control, r.controlCPU)
			}
			certs, errorsSeen = min(certs, r.run.sum.Certs), errorsSeen+r.run.sum.Errors
			reviews, changes, peak = max(reviews, r.tokenReviews), changes+r.leaderChanges, max(peak, r.rssPeak)
			for code, n := range r.run.sum.ErrorsByCode {
				byCode[code] += n
			}
			for code, msg := range r.run.sum.ErrorSamples {
				if _, ok := samples[code]; !ok {
					samples[code] = msg
				}
			}
		}
		b.res.set(key+"rounds", len(rs))
		b.res.set(key+"ztunnels", midSum.Ztunnels)
		b.res.set(key+"planned_certs", planned)
		b.res.set(key+"distinct_tokens", midSum.Ztunnels) // one token per ztunnel
		b.res.set(key+"certs", certs)
		b.res.set(key+"errors", errorsSeen)
		b.res.set(key+"errors_by_code", byCode)
		b.res.set(key+"error_samples", samples)
		b.res.set(key+"tokenreviews", reviews)
		b.res.set(key+"leader_changes", changes)
		b.res.set(key+"seconds", median(seconds))
		b.res.set(key+"seconds_min", seconds[0])
		b.res.set(key+"seconds_max", seconds[len(seconds)-1])
		b.res.set(key+"seconds_runs", seconds)
		if len(efficiency) > 0 {
			b.res.set(key+"floor_efficiency", median(efficiency))
		}
		if len(cpu) > 0 {
			b.res.set(key+"server_cpu_seconds", median(cpu))
		}
		if len(control) > 0 {
			b.res.set(key+"control_plane_cpu_seconds", median(control))
		}
		b.res.set(key+"p99_ms", midSum.LatencyMS.P99)
		b.res.set(key+"certs_per_second", midSum.CertsPerSecond)
		b.res.set(key+"errors_per_second", midSum.ErrorsPerSecond)
		for name, series := range mid.run.perSecond {
			b.res.set(key+name+"_cores_per_second", series)
		}
		if mid.rssEnd > 0 {
			b.res.set(key+"ca_rss_mib_end", mid.rssEnd)
			b.res.set(key+"ca_rss_mib_peak", peak)
		}
		b.logf("%s storms (%s retries): %d, median %.1fs (%.1f-%.1f), the fewest certificates %d of %d, %d errors, at most %d TokenReviews, %d leader changes",
			strings.TrimSuffix(key, "_"), v.retry, len(rs), median(seconds), seconds[0], seconds[len(seconds)-1], certs, planned, errorsSeen, reviews, changes)
		label := v.retry + " retries"
		if len(v.args)+len(v.env) > 0 {
			label += ", " + strings.Join(append(slices.Clone(v.env), v.args...), " ")
		}
		if len(rs) > 1 {
			label += fmt.Sprintf(" (median of %d)", len(rs))
		}
		curves = append(curves, curve{label: label, certs: midSum.CertsPerSecond, errs: midSum.ErrorsPerSecond})
	}
	if len(floors) > 0 {
		floor := median(floors)
		b.res.set("storm_floor_certs_per_cpu_second", floor)
		b.res.set("storm_floor_seconds", float64(planned)/floor)
	}
	if z, ok := b.res.num("storm_seconds"); ok && z > 0 {
		if a, ok := b.res.num("storm_aggressive_seconds"); ok && a > 0 {
			b.res.set("storm_aggressive_to_ztunnel_ratio", a/z)
		}
		if c, ok := b.res.num("storm_compare_seconds"); ok && c > 0 {
			b.res.set("storm_compare_to_base_ratio", c/z)
		}
	}
	if len(curves) == 0 {
		return nil
	}
	path := strings.TrimSuffix(b.opts.out, ".json") + "-storm.png"
	if err := plotStorms(path, b.opts.stormZtunnels, b.opts.stormIdentities, curves); err != nil {
		return fmt.Errorf("goodput plot: %w", err)
	}
	b.logf("  goodput plot: %s", path)
	return nil
}

// measureStorm has every ztunnel of plan ask for all its identities at
// once from ca, retrying as retry says, and returns what it took: the
// goodput of each second, the TokenReviews the apiserver audited, the
// leader's Lease, and the CA's memory. planned is the plan's identities.
// The first ztunnel-like storm (first) is profiled as the options ask
// and holds its connections open after it to measure them idle.
func (b *bench) measureStorm(ctx context.Context, cp *controlplane.ControlPlane, ca *cahost.CA, plan string, planned int, retry string, first bool) (*stormRun, error) {
	b.logf("cold-start storm, %s retries: %d ztunnels × %d identities at once, fresh CA", retry,
		b.opts.stormZtunnels, b.opts.stormIdentities)
	reviewsBefore, err := cp.CountAudit("", "tokenreviews")
	if err != nil {
		return nil, err
	}
	leaseBefore, err := readLease(ctx, cp)
	if err != nil {
		return nil, err
	}
	args := []string{"--once", "--plan", plan, "--duration", b.opts.stormDeadline.String(), "--retry", retry}
	var idle *idleMemory
	if retry != loadtest.RetryZtunnel {
		// A misbehaving client asks for every identity at once, not 8.
		args = append(args, "--in-flight", strconv.Itoa(max(loadtest.DefaultInFlight, b.opts.stormIdentities)))
	}
	profiled := func() {}
	if retry == loadtest.RetryZtunnel && first {
		args = append(args, "--hold", stormHold.String())
		idle = b.watchIdle(ctx, ca, planned)
		started := func(ctx context.Context) error {
			if err := b.firstRequest(ctx); err != nil {
				return err
			}
			select {
			case <-time.After(b.opts.stormCPUProfileDelay):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		cpu := b.profileWhen(ctx, "profile", b.opts.stormCPUProfile, started)
		heap := b.profileWhen(ctx, "heap", b.opts.stormHeapProfile, started)
		profiled = func() { cpu(); heap() }
	}
	r, runErr := b.runLoadtest(ctx, cp, ca, args...)
	profiled()
	if r == nil {
		return nil, runErr
	}
	s := r.sum
	// The apiserver writes an audit event just after its response.
	time.Sleep(500 * time.Millisecond)
	reviewsAfter, err := cp.CountAudit("", "tokenreviews")
	if err != nil {
		return nil, err
	}
	leaseAfter, err := readLease(ctx, cp)
	if err != nil {
		return nil, err
	}
	out := &stormRun{run: r, tokenReviews: reviewsAfter - reviewsBefore, serverCPU: -1, controlCPU: -1}
	out.leaderChanges = int(leaseAfter.transitions - leaseBefore.transitions)
	if out.leaderChanges == 0 && leaseAfter.holder != leaseBefore.holder {
		out.leaderChanges = 1
	}
	if r.cores["server"] >= 0 {
		out.serverCPU = r.cpu["server"]
	}
	if r.cores["apiserver"] >= 0 && r.cores["etcd"] >= 0 {
		out.controlCPU = r.cpu["apiserver"] + r.cpu["etcd"]
	}
	if rss, peak, err := residentMiB(ca.Pid()); err == nil {
		out.rssEnd, out.rssPeak = rss, peak
	}
	b.logf("  all %d ztunnels done after %.3fs (%d of them), %d of %d certificates, %d TokenReviews, %d leader changes, errors %d %v",
		s.Ztunnels, s.AllDoneSeconds, s.ZtunnelsDone, s.Certs, planned, out.tokenReviews, out.leaderChanges, s.Errors, s.ErrorsByCode)
	b.logf("  certificates per second: %v", s.CertsPerSecond)
	b.logf("  CPU seconds: the CA %.1f, the apiserver and etcd %.1f", out.serverCPU, out.controlCPU)
	for _, name := range []string{"server", "client", "apiserver", "etcd"} {
		b.logf("  cores of the %s in each second: %v", name, r.perSecond[name])
	}
	for code, msg := range s.ErrorSamples {
		b.logf("  first %s: %s", code, msg)
	}
	if idle != nil {
		b.recordIdle(idle, s.Ztunnels)
	}
	return out, runErr
}

// firstRequest returns once the CA has started to answer a certificate
// request (the load generator prepares its keys first), polling /metrics.
func (b *bench) firstRequest(ctx context.Context) error {
	for {
		samples, err := promserver.Scrape(ctx, b.adminAddr)
		if err != nil {
			return err
		}
		if n, _ := samples.Sum("grpc_server_started_total", "grpc_method", "CreateCertificate"); n > 0 {
			return nil
		}
		select {
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// lease is the leader election Lease's holder and transitions.
type lease struct {
	holder      string
	transitions int32
}

func readLease(ctx context.Context, cp *controlplane.ControlPlane) (lease, error) {
	l, err := cp.Client().CoordinationV1().Leases(leaseNamespace).Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		return lease{}, fmt.Errorf("leader election lease: %w", err)
	}
	var out lease
	if h := l.Spec.HolderIdentity; h != nil {
		out.holder = *h
	}
	if t := l.Spec.LeaseTransitions; t != nil {
		out.transitions = *t
	}
	return out, nil
}

// idleMemory is the CA's memory with no connection and, after a storm,
// with every ztunnel's connection open and idle, each after a forced
// garbage collection.
type idleMemory struct {
	done       chan struct{}
	err        error
	base, idle memory
	// The most the storm held in goroutine stacks, goroutines and heap
	// spans in use, as sampled every second.
	peakStacks, peakGoroutines, peakHeap float64
}

// memory is what a CA holds at one time.
type memory struct {
	goBytes    float64 // live Go heap plus goroutine stacks
	stacks     float64 // of which goroutine stacks
	rss        float64 // bytes
	goroutines float64
}

// watchIdle measures the CA's memory now, then again once it has issued
// planned certificates (the storm is over; its connections are held idle)
// and a second has passed.
func (b *bench) watchIdle(ctx context.Context, ca *cahost.CA, planned int) *idleMemory {
	m := &idleMemory{done: make(chan struct{})}
	m.base, m.err = b.settledMemory(ctx, ca, "")
	go func() {
		defer close(m.done)
		if m.err != nil {
			return
		}
		deadline := time.Now().Add(b.opts.stormDeadline + 10*time.Minute) // the load generator first makes its keys
		for {
			samples, err := promserver.Scrape(ctx, b.adminAddr)
			if err != nil { // the CA is busy: try again
				if time.Now().After(deadline) || ctx.Err() != nil {
					m.err = err
					return
				}
				continue
			}
			stacks, _ := samples.Sum("go_memstats_stack_inuse_bytes")
			goroutines, _ := samples.Sum("go_goroutines")
			heap, _ := samples.Sum("go_memstats_heap_inuse_bytes")
			m.peakStacks, m.peakGoroutines = max(m.peakStacks, stacks), max(m.peakGoroutines, goroutines)
			m.peakHeap = max(m.peakHeap, heap)
			if issued, _ := samples.Sum("workload_ca_certificate_requests_total", "result", "issued"); issued >= float64(planned) {
				break
			}
			if time.Now().After(deadline) {
				m.err = errors.New("the storm never issued every certificate")
				return
			}
			time.Sleep(time.Second) // a scrape costs the CA a few ms
		}
		time.Sleep(time.Second)
		m.idle, m.err = b.settledMemory(ctx, ca, b.opts.idleHeapProfile)
	}()
	return m
}

// settledCollections is how many collections settledMemory forces: each
// halves the stack of an idle goroutine that uses under a quarter of it,
// as the collections of a long-idle connection's life would.
const settledCollections = 4

// settledMemory forces garbage collections in the CA (its pprof heap
// handler does; the last profile goes to profile, if set) and reads its
// heap in use, goroutine stacks and goroutines from /metrics, and its
// resident set.
func (b *bench) settledMemory(ctx context.Context, ca *cahost.CA, profile string) (memory, error) {
	var heapProfile []byte
	for range settledCollections {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.adminAddr+"/debug/pprof/heap?gc=1", http.NoBody)
		if err != nil {
			return memory{}, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return memory{}, err
		}
		heapProfile, err = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		switch {
		case err != nil:
			return memory{}, err
		case resp.StatusCode != http.StatusOK:
			return memory{}, fmt.Errorf("forcing a collection: /debug/pprof/heap: %s", resp.Status)
		}
	}
	if profile != "" {
		if err := os.WriteFile(profile, heapProfile, 0o600); err != nil {
			return memory{}, err
		}
	}
	samples, err := promserver.Scrape(ctx, b.adminAddr)
	if err != nil {
		return memory{}, err
	}
	heap, _ := samples.Sum("go_memstats_heap_alloc_bytes") // live, after the collections
	stack, _ := samples.Sum("go_memstats_stack_inuse_bytes")
	goroutines, _ := samples.Sum("go_goroutines")
	rssMiB, _, err := residentMiB(ca.Pid())
	return memory{goBytes: heap + stack, stacks: stack, rss: rssMiB * (1 << 20), goroutines: goroutines}, err
}

// recordIdle records what each of conns idle connections cost the CA.
func (b *bench) recordIdle(m *idleMemory, conns int) {
	<-m.done
	if m.err != nil {
		b.logf("  idle connection memory: %v", m.err)
		return
	}
	n := float64(conns)
	perConn := (m.idle.goBytes - m.base.goBytes) / n
	rssPerConn := (m.idle.rss - m.base.rss) / n
	goroutines := (m.idle.goroutines - m.base.goroutines) / n
	stacks := (m.idle.stacks - m.base.stacks) / n
	b.res.set("idle_connections", conns)
	b.res.set("idle_bytes_per_connection", perConn)
	b.res.set("idle_rss_bytes_per_connection", rssPerConn)
	b.res.set("idle_goroutines_per_connection", goroutines)
	b.res.set("idle_stack_bytes_per_connection", stacks)
	b.res.set("storm_peak_goroutines", m.peakGoroutines)
	b.res.set("storm_peak_stack_mib", m.peakStacks/(1<<20))
	b.res.set("storm_peak_heap_mib", m.peakHeap/(1<<20))
	b.logf("  at the storm's peak: %.0f goroutines, %.0f MiB of stacks, %.0f MiB of heap in use",
		m.peakGoroutines, m.peakStacks/(1<<20), m.peakHeap/(1<<20))
	b.logf("  %d idle ztunnel connections: %.1f KiB each of Go heap and stacks (%.1f KiB of stacks, %.1f goroutines), %.1f KiB of resident set",
		conns, perConn/1024, stacks/1024, goroutines, rssPerConn/1024)
}

// residentMiB reads a process's resident set and its peak, in MiB.
func residentMiB(pid int) (rss, peak float64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	var found int
	for _, line := range strings.Split(string(b), "\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/status %s: %w", pid, name, err)
		}
		found++
		if name == "VmRSS" {
			rss = kb / 1024
		} else {
			peak = kb / 1024
		}
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("/proc/%d/status: no VmRSS or VmHWM", pid)
	}
	return rss, peak, nil
}
