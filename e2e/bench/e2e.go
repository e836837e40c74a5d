package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/e2e/internal/proc"
	"github.com/workload-ca/workload-ca/loadtest"
)

// startCA starts `workload-ca serve` (with the extra flags) in the work dir (the same CA
// material every time) and records how long it took to become ready:
// cahost's exec→SERVING, and our own poll of /readyz on the admin port.
// It logs at info level and writes audit records to a file of its own, as
// a production deployment would, rather than through a pipe to us.
func (b *bench) startCA(ctx context.Context, cp *controlplane.ControlPlane, phase string, extra ...string) (*cahost.CA, error) {
	return b.startCAWith(ctx, cp, phase, nil, nil, extra...)
}

// startCAWith is startCA with env added to the CA's environment and the
// flags last after every other (--serve-arg too), so that they win.
func (b *bench) startCAWith(ctx context.Context, cp *controlplane.ControlPlane, phase string, env, last []string, extra ...string) (*cahost.CA, error) {
	ports, err := proc.FreePorts(1)
	if err != nil {
		return nil, err
	}
	adminAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	auditLog := filepath.Join(b.workDir, "ca-audit-"+phase+".jsonl")
	args := append([]string{"--admin-addr", adminAddr, "--log-level", "info", "--audit-log", auditLog}, extra...)
	args = append(append(args, b.opts.serveArgs...), last...)
	// The storms force collections through pprof, to measure memory.
	if b.opts.cpuProfile != "" || b.opts.halfCPUProfile != "" || b.opts.halfTrace != "" || phase != "start" {
		args = append(args, "--pprof")
	}
	pollCtx, stopPoll := context.WithCancel(ctx)
	defer stopPoll()
	began := time.Now()
	readyz := pollReadyz(pollCtx, adminAddr, began)
	ca, err := cahost.Start(ctx, cahost.Options{Binary: b.opts.binary, Kubeconfig: cp.KubeconfigPath(),
		WorkDir: filepath.Join(b.workDir, "ca"), ExtraArgs: args, Env: append(slices.Clone(b.opts.serveEnv), env...), CPUs: b.place.server})
	if err != nil {
		return nil, err
	}
	var toReadyz time.Duration
	select {
	case toReadyz = <-readyz:
	case <-time.After(5 * time.Second):
		toReadyz = -1
	}
	b.res.set(phase+"_to_ready_seconds", ca.StartupTime().Seconds())
	if toReadyz >= 0 {
		b.res.set(phase+"_to_readyz_seconds", toReadyz.Seconds())
	}
	b.logf("workload-ca %s: SERVING after %v (/readyz 200 after %v), pid %d", phase,
		ca.StartupTime().Round(time.Millisecond), toReadyz.Round(time.Millisecond), ca.Pid())
	b.adminAddr, b.auditLog = adminAddr, auditLog
	return ca, nil
}

// pollReadyz polls http://addr/readyz every 10ms and sends the time since
// began at the first 200.
func pollReadyz(ctx context.Context, addr string, began time.Time) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	client := &http.Client{Timeout: time.Second}
	go func() {
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", http.NoBody)
			if resp, err := client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					out <- time.Since(began)
					return
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return out
}

// loadRun is one `workload-ca loadtest` and the CPU its processes used in
// its measured window.
type loadRun struct {
	sum   *loadtest.Summary
	cpu   map[string]float64 // CPU seconds in the window, by process
	cores map[string]float64 // cores kept busy in the window
	// steal is the share of CPU time the hypervisor took in the window, in
	// percent, of all CPUs ("all") and, when split, of the CA's ("server")
	// and the load generator's ("client"). A CPU taken away for a few
	// milliseconds stalls whatever runs on it: it shows in the tail
	// latency, not in the CPU time of the processes.
	steal map[string]float64
	// perSecond is the cores each process kept busy in each second of a
	// storm (its window from the start), beside its goodput curve.
	perSecond map[string][]float64
}

// stealGroups are the sets of CPUs whose steal a load run reports: "all"
// is the CPUs this process may use.
func (b *bench) stealGroups() map[string][]int {
	groups := map[string][]int{}
	if cpus, err := proc.CPUs(); err == nil {
		groups["all"] = cpus
	}
	if b.place.server != nil {
		groups["server"], groups["client"] = b.place.server, b.place.client
	}
	return groups
}

// runLoadtest runs the load generator as a process of its own against ca,
// sampling the CPU time of the CA, the apiserver, etcd and itself.
func (b *bench) runLoadtest(ctx context.Context, cp *controlplane.ControlPlane, ca *cahost.CA, args ...string) (*loadRun, error) {
	rootCert, removeRoots, err := ca.RootCertFile(ctx)
	if err != nil {
		return nil, err
	}
	defer removeRoots()
	args = append([]string{"loadtest", "--output", "json", "--addr", ca.Addr(), "--server-name", cahost.ServerName,
		"--root-cert", rootCert}, args...)
	b.logf("  %s %v", filepath.Base(b.opts.binary), args)
	var stdout bytes.Buffer
	p, err := proc.Start("workload-ca loadtest", b.opts.binary, args, cahost.ChildEnv(), &stdout,
		prefixWriter{w: b.log, prefix: "  | "}, proc.OnCPUs(b.place.client...))
	if err != nil {
		return nil, err
	}
	etcd, apiserver := cp.PIDs()
	groups := b.stealGroups()
	stealOf := map[string][]int{}
	for name, cpus := range groups {
		stealOf["steal_"+name] = cpus
	}
	s := startSampler(map[string]int{"server": ca.Pid(), "apiserver": apiserver, "etcd": etcd, "client": p.Pid()}, stealOf)
	select {
	case <-p.Done():
	case <-ctx.Done():
		_ = p.Kill(10 * time.Second)
	}
	runErr := p.Err()
	s.Stop()
	r := &loadRun{sum: &loadtest.Summary{}, cpu: map[string]float64{}, cores: map[string]float64{}, steal: map[string]float64{}}
	if err := json.Unmarshal(stdout.Bytes(), r.sum); err != nil {
		if runErr != nil {
			return nil, fmt.Errorf("workload-ca loadtest: %w", runErr)
		}
		return nil, fmt.Errorf("workload-ca loadtest output %q: %w", stdout.String(), err)
	}
	for name := range s.pids {
		r.cpu[name], r.cores[name] = s.coresUsed(name, r.sum.WindowStart, r.sum.WindowEnd)
		if len(r.sum.CertsPerSecond) == 0 {
			continue
		}
		if r.perSecond == nil {
			r.perSecond = map[string][]float64{}
		}
		for i := range r.sum.CertsPerSecond {
			from := r.sum.WindowStart.Add(time.Duration(i) * time.Second)
			to := from.Add(time.Second)
			if to.After(r.sum.WindowEnd) {
				to = r.sum.WindowEnd
			}
			_, cores := s.coresUsed(name, from, to)
			r.perSecond[name] = append(r.perSecond[name], math.Round(100*cores)/100)
		}
	}
	for name, cpus := range groups {
		if _, cores := s.coresUsed("steal_"+name, r.sum.WindowStart, r.sum.WindowEnd); cores >= 0 {
			r.steal[name] = 100 * cores / float64(len(cpus))
		}
	}
	if runErr != nil { // a summary, and a failure (an incomplete storm)
		return r, fmt.Errorf("workload-ca loadtest: %w", runErr)
	}
	return r, nil
}

// prefixWriter prefixes every write (the load generator writes whole
// lines) with prefix.
type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	lines := bytes.SplitAfter(b, []byte("\n"))
	var out bytes.Buffer
	for _, l := range lines {
		if len(l) > 0 {
			out.WriteString(p.prefix)
			out.Write(l)
		}
	}
	if _, err := p.w.Write(out.Bytes()); err != nil {
		return 0, err
	}
	return len(b), nil
}

// measureMaxRate runs the load generator at its maximum rate and returns
// the rate.
func (b *bench) measureMaxRate(ctx context.Context, cp *controlplane.ControlPlane, ca *cahost.CA, plan string) (float64, error) {
	b.logf("end to end at the maximum rate: %d ztunnels × %d identities, %v after %v warm-up", b.opts.ztunnels, b.opts.identities, b.opts.duration, b.opts.warmup)
	profiled := b.profile(ctx, "profile", b.opts.cpuProfile, b.opts.warmup)
	r, err := b.runLoadtest(ctx, cp, ca, "--plan", plan, "--duration", b.opts.duration.String(), "--warmup", b.opts.warmup.String())
	profiled()
	if err != nil {
		return 0, err
	}
	s := r.sum
	b.res.set("e2e_ztunnels", s.Ztunnels)
	b.res.set("e2e_identities", s.Identities)
	b.res.set("e2e_certs_per_sec", s.CertsPerSec)
	b.res.set("e2e_errors", s.Errors)
	b.res.set("e2e_p50_ms", s.LatencyMS.P50)
	b.res.set("e2e_p99_ms", s.LatencyMS.P99)
	b.res.set("e2e_p99_9_ms", s.LatencyMS.P999)
	for _, p := range []string{"server", "client", "apiserver", "etcd"} {
		if r.cores[p] >= 0 {
			b.res.set("e2e_"+p+"_cores_used", r.cores[p])
		}
	}
	if cores := r.cores["server"]; cores > 0 && s.Certs > 0 {
		b.res.set("cpu_seconds_per_cert", r.cpu["server"]/float64(s.Certs))
		b.res.set("e2e_certs_per_server_cpu_second", s.CertsPerSec/cores)
	}
	b.logf("  %.0f certs/s, server %.2f cores, client %.2f cores, p99 %.2fms, errors %d %v",
		s.CertsPerSec, r.cores["server"], r.cores["client"], s.LatencyMS.P99, s.Errors, s.ErrorsByCode)
	b.recordSteal("e2e", r)
	return s.CertsPerSec, nil
}

// profile starts taking the server's profile of kind ("profile": CPU,
// or "trace": execution trace) into path for the measured window of a load
// run that warms up for warmup, and returns the function that waits for
// it and logs the outcome. With no path, it does nothing.
func (b *bench) profile(ctx context.Context, kind, path string, warmup time.Duration) (wait func()) {
	return b.profileWhen(ctx, kind, path, func(ctx context.Context) error {
		// Approximately the window: a second after the warm-up (the load
		// generator takes time to prepare).
		select {
		case <-time.After(warmup + time.Second):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// profileWhen is profile starting once ready returns, for --duration
// less 2s.
func (b *bench) profileWhen(ctx context.Context, kind, path string, ready func(context.Context) error) (wait func()) {
	if path == "" {
		return func() {}
	}
	done := make(chan error, 1)
	go func() {
		if err := ready(ctx); err != nil {
			done <- err
			return
		}
		done <- b.fetchProfile(ctx, kind, path)
	}()
	return func() {
		if err := <-done; err != nil {
			b.logf("  server %s: %v", kind, err)
			return
		}
		b.logf("  server %s: %s", kind, path)
	}
}

// fetchProfile takes the server's profile of kind into path, for
// --duration less 2s; a heap profile is the heap now.
func (b *bench) fetchProfile(ctx context.Context, kind, path string) error {
	secs := max(1, int((b.opts.duration - 2*time.Second).Seconds()))
	query := "?seconds=" + strconv.Itoa(secs)
	if kind == "heap" {
		query = ""
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		"http://"+b.adminAddr+"/debug/pprof/"+kind+query, http.NoBody)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: time.Duration(secs+30) * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /debug/pprof/profile: %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// measureHalfRate runs the load generator open loop at rate (half the
// maximum) for latency.
func (b *bench) measureHalfRate(ctx context.Context, cp *controlplane.ControlPlane, ca *cahost.CA, plan string, rate float64) error {
	b.logf("end to end at half the maximum rate: %.0f requests/s, open loop", rate)
	profiled := b.profile(ctx, "profile", b.opts.halfCPUProfile, b.opts.halfWarmup)
	traced := b.profile(ctx, "trace", b.opts.halfTrace, b.opts.halfWarmup)
	gc := b.watchGC(ctx, b.opts.halfWarmup)
	r, err := b.runLoadtest(ctx, cp, ca, "--plan", plan, "--rate", strconv.FormatFloat(rate, 'f', 1, 64),
		"--duration", b.opts.duration.String(), "--warmup", b.opts.halfWarmup.String())
	b.stopGC(ctx, gc)
	profiled()
	traced()
	if err != nil {
		return err
	}
	s := r.sum
	b.res.set("half_rate_target", rate)
	b.res.set("half_rate_certs_per_sec", s.CertsPerSec)
	b.res.set("half_rate_errors", s.Errors)
	b.res.set("p50_ms_at_half_rate", s.LatencyMS.P50)
	b.res.set("p99_ms_at_half_rate", s.LatencyMS.P99)
	b.res.set("p99_9_ms_at_half_rate", s.LatencyMS.P999)
	for _, p := range []string{"server", "client"} {
		if r.cores[p] >= 0 {
			b.res.set("half_rate_"+p+"_cores_used", r.cores[p])
		}
	}
	b.logf("  %.0f certs/s, p50 %.2fms, p99 %.2fms, p99.9 %.2fms, errors %d %v",
		s.CertsPerSec, s.LatencyMS.P50, s.LatencyMS.P99, s.LatencyMS.P999, s.Errors, s.ErrorsByCode)
	b.recordSteal("half_rate", r)
	if lag := s.StartLagMS; lag != nil {
		b.res.set("client_start_lag_p50_ms_at_half_rate", lag.P50)
		b.res.set("client_start_lag_p99_ms_at_half_rate", lag.P99)
		b.logf("  of which the load generator's own lag in sending: p50 %.2fms, p99 %.2fms", lag.P50, lag.P99)
	}
	// What the client saw includes the transport, the kernel's scheduling of
	// client and server on shared cores, and the client itself; the audit
	// log says how long the service took.
	took, err := handlingTimes(b.auditLog, s.WindowStart, s.WindowEnd)
	if err != nil {
		return fmt.Errorf("service latency from the audit log: %w", err)
	}
	b.res.set("service_p50_ms_at_half_rate", ms(quantile(took, 0.50)))
	b.res.set("service_p99_ms_at_half_rate", ms(quantile(took, 0.99)))
	b.logf("  the service itself (audit log, %d requests): p50 %.2fms, p99 %.2fms",
		len(took), ms(quantile(took, 0.50)), ms(quantile(took, 0.99)))
	b.recordGC("half_rate", gc)
	return nil
}

// recordSteal records and logs the CPU steal of a load run.
func (b *bench) recordSteal(phase string, r *loadRun) {
	all, ok := r.steal["all"]
	if !ok {
		return
	}
	b.res.set(phase+"_cpu_steal_percent", all)
	line := fmt.Sprintf("  CPU steal by the hypervisor: %.1f%% of all CPUs", all)
	if server, ok := r.steal["server"]; ok {
		b.res.set(phase+"_cpu_steal_percent_server_cpus", server)
		b.res.set(phase+"_cpu_steal_percent_client_cpus", r.steal["client"])
		line += fmt.Sprintf(" (the CA's %.1f%%, the load generator's %.1f%%)", server, r.steal["client"])
	}
	b.logf("%s", line)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
