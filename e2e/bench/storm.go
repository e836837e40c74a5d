package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
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

// storm is one cold-start storm's outcome.
type storm struct {
	sum *loadtest.Summary
	run *loadRun
}

// measureStorms runs the cold-start storm twice, each time against a
// freshly started CA (an empty token cache): with ztunnel's retries, then
// with a client that asks for every identity at once and retries at once. The first keeps its connections open
// afterwards, idle, to measure what they cost the CA.
func (b *bench) measureStorms(ctx context.Context, cp *controlplane.ControlPlane, plan string, planned int) error {
	var errs []error
	var curves []curve
	floorBefore, err := b.floor(keystore.KeyECDSAP256)
	if err != nil {
		return fmt.Errorf("crypto floor before the storms: %w", err)
	}
	defer func() { b.recordStormFloor(floorBefore.perCPUSecond, planned) }()
	for _, retry := range []string{loadtest.RetryZtunnel, loadtest.RetryAggressive} {
		phase := "restart"
		if retry != loadtest.RetryZtunnel {
			phase += "_" + retry
		}
		ca, err := b.startCA(ctx, cp, phase)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		s, err := b.measureStorm(ctx, cp, ca, plan, planned, retry)
		errs = append(errs, err, ca.Stop())
		if s != nil {
			curves = append(curves, curve{label: retry + " retries", certs: s.sum.CertsPerSecond, errs: s.sum.ErrorsPerSecond})
		}
		if ctx.Err() != nil {
			break
		}
	}
	if z, ok := b.res.num("storm_seconds"); ok && z > 0 {
		if a, ok := b.res.num("storm_aggressive_seconds"); ok && a > 0 {
			b.res.set("storm_aggressive_to_ztunnel_ratio", a/z)
		}
	}
	if len(curves) > 0 {
		path := strings.TrimSuffix(b.opts.out, ".json") + "-storm.png"
		if err := plotStorms(path, b.opts.stormZtunnels, b.opts.stormIdentities, curves); err != nil {
			errs = append(errs, fmt.Errorf("goodput plot: %w", err))
		} else {
			b.logf("  goodput plot: %s", path)
		}
	}
	return errors.Join(errs...)
}

// recordStormFloor measures the crypto floor again after the storms and
// records what it bounds them to: planned certificates at the mean of the
// floor before and after (on the CA's one CPU) take storm_floor_seconds,
// and storm_floor_efficiency is that over the storm's time. The floor of a
// shared machine moves by a third within minutes and by more from day to
// day; the efficiency says how much of a storm's time the CA itself adds.
func (b *bench) recordStormFloor(before float64, planned int) {
	after, err := b.floor(keystore.KeyECDSAP256)
	if err != nil {
		b.logf("  crypto floor after the storms: %v", err)
		return
	}
	floor := (before + after.perCPUSecond) / 2
	seconds := float64(planned) / floor
	b.res.set("storm_floor_certs_per_cpu_second", floor)
	b.res.set("storm_floor_seconds", seconds)
	b.logf("crypto floor around the storms: %.0f certs per CPU-second (before %.0f, after %.0f): %d certificates take %.1fs of one CPU",
		floor, before, after.perCPUSecond, planned, seconds)
	for _, key := range []string{"storm_", "storm_aggressive_"} {
		if s, ok := b.res.num(key + "seconds"); ok && s > 0 {
			b.res.set(key+"floor_efficiency", seconds/s)
		}
	}
}

// measureStorm has every ztunnel of plan ask for all its identities at
// once from ca, retrying as retry says, and records what it took: the
// goodput of each second, the TokenReviews the apiserver audited, the
// leader's Lease, and the CA's memory. planned is the plan's identities.
func (b *bench) measureStorm(ctx context.Context, cp *controlplane.ControlPlane, ca *cahost.CA, plan string, planned int, retry string) (*storm, error) {
	key := "storm_"
	if retry != loadtest.RetryZtunnel {
		key += retry + "_"
	}
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
	if retry == loadtest.RetryZtunnel {
		args = append(args, "--hold", stormHold.String())
		idle = b.watchIdle(ctx, ca, planned)
	} else {
		// A misbehaving client asks for every identity at once, not 8.
		args = append(args, "--in-flight", strconv.Itoa(max(loadtest.DefaultInFlight, b.opts.stormIdentities)))
	}
	profiled := func() {}
	if retry == loadtest.RetryZtunnel {
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
	changes := int(leaseAfter.transitions - leaseBefore.transitions)
	if changes == 0 && leaseAfter.holder != leaseBefore.holder {
		changes = 1
	}
	b.res.set(key+"ztunnels", s.Ztunnels)
	b.res.set(key+"certs", s.Certs)
	b.res.set(key+"planned_certs", planned)
	b.res.set(key+"errors", s.Errors)
	b.res.set(key+"errors_by_code", s.ErrorsByCode)
	b.res.set(key+"error_samples", s.ErrorSamples)
	b.res.set(key+"distinct_tokens", s.Ztunnels) // one token per ztunnel
	b.res.set(key+"tokenreviews", reviewsAfter-reviewsBefore)
	b.res.set(key+"seconds", s.AllDoneSeconds)
	b.res.set(key+"p99_ms", s.LatencyMS.P99)
	b.res.set(key+"leader_changes", changes)
	b.res.set(key+"certs_per_second", s.CertsPerSecond)
	b.res.set(key+"errors_per_second", s.ErrorsPerSecond)
	if r.cores["server"] >= 0 {
		b.res.set(key+"server_cpu_seconds", r.cpu["server"])
	}
	if rss, peak, err := residentMiB(ca.Pid()); err == nil {
		b.res.set(key+"ca_rss_mib_end", rss)
		b.res.set(key+"ca_rss_mib_peak", peak)
	}
	b.logf("  all %d ztunnels done after %.3fs (%d of them), %d of %d certificates, %d TokenReviews, %d leader changes, errors %d %v",
		s.Ztunnels, s.AllDoneSeconds, s.ZtunnelsDone, s.Certs, planned, reviewsAfter-reviewsBefore, changes, s.Errors, s.ErrorsByCode)
	b.logf("  certificates per second: %v", s.CertsPerSecond)
	for code, msg := range s.ErrorSamples {
		b.logf("  first %s: %s", code, msg)
	}
	if idle != nil {
		b.recordIdle(idle, s.Ztunnels)
	}
	return &storm{sum: s, run: r}, runErr
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
