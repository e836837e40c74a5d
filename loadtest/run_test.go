package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestPace(t *testing.T) {
	start := time.Now()
	end := start.Add(200 * time.Millisecond)
	var dues []time.Time
	pace(context.Background(), start, end, 1000, func(i uint64, due time.Time) {
		if i != uint64(len(dues)) {
			t.Fatalf("emitted %d after %d requests", i, len(dues))
		}
		if now := time.Now(); now.Before(due) {
			t.Fatalf("request %d emitted %v before it was due", i, due.Sub(now))
		}
		dues = append(dues, due)
	})
	if len(dues) != 200 {
		t.Fatalf("emitted %d requests in 200ms at 1000/s, want 200", len(dues))
	}
	for i, d := range dues {
		if want := start.Add(time.Duration(i) * time.Millisecond); !d.Equal(want) {
			t.Fatalf("request %d due at +%v, want +%v", i, d.Sub(start), want.Sub(start))
		}
	}
	if late := time.Since(end); late > 100*time.Millisecond {
		t.Errorf("pace returned %v after the end", late)
	}
}

func TestPaceStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	start := time.Now()
	pace(ctx, start, start.Add(time.Hour), 100, func(uint64, time.Time) {
		if n++; n == 3 {
			cancel()
		}
	})
	if n != 3 {
		t.Errorf("emitted %d requests, want 3 (cancelled after the third)", n)
	}
}

func TestRunClosedLoop(t *testing.T) {
	f := &fakeCA{delay: 5 * time.Millisecond, holdUntil: 8}
	cfg := startFake(t, f)
	cfg.Plan = plan(3, 4)
	cfg.Warmup, cfg.Duration = 100*time.Millisecond, 300*time.Millisecond
	var progress bytes.Buffer
	cfg.Progress, cfg.ProgressInterval = &syncWriter{w: &progress}, 30*time.Millisecond
	s, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode != "max" || s.Ztunnels != 3 || s.Identities != 12 || s.InFlight != 8 {
		t.Errorf("summary header %+v", s)
	}
	if s.Errors != 0 || s.Certs == 0 {
		t.Fatalf("certs %d, errors %v", s.Certs, s.ErrorsByCode)
	}
	if got := float64(s.Certs) / 0.3; s.CertsPerSec != got {
		t.Errorf("certs/s %v, want certs/window %v", s.CertsPerSec, got)
	}
	if s.LatencyMS.P50 < 5 || s.LatencyMS.P99 < s.LatencyMS.P50 || s.LatencyMS.Max < s.LatencyMS.P999 {
		t.Errorf("latency %+v: want p50 >= the server's 5ms and ordered percentiles", s.LatencyMS)
	}
	if !s.WindowEnd.Equal(s.WindowStart.Add(300 * time.Millisecond)) {
		t.Errorf("window %v .. %v", s.WindowStart, s.WindowEnd)
	}
	for _, z := range cfg.Plan {
		if got := f.maxInFlightOf(z.Token); got != 8 {
			t.Errorf("%s: at most %d requests in flight, want exactly 8", z.Token, got)
		}
	}
	checkOwnConnections(t, f, cfg.Plan)
	if !strings.Contains(progress.String(), "warm-up") || !strings.Contains(progress.String(), "measuring") {
		t.Errorf("progress lines:\n%s", progress.String())
	}
}

// checkOwnConnections checks that every ztunnel used one connection of its
// own.
func checkOwnConnections(t *testing.T, f *fakeCA, p Plan) {
	t.Helper()
	seen := map[string]string{}
	for _, z := range p {
		peers := f.peersOf(z.Token)
		if len(peers) != 1 {
			t.Errorf("%s used %d connections %v, want 1", z.Token, len(peers), peers)
			continue
		}
		if other, ok := seen[peers[0]]; ok {
			t.Errorf("%s and %s share connection %s", z.Token, other, peers[0])
		}
		seen[peers[0]] = z.Token
	}
}

func TestRunOpenLoopRate(t *testing.T) {
	f := &fakeCA{}
	cfg := startFake(t, f)
	cfg.Plan = plan(4, 2)
	cfg.Rate = 200
	cfg.Warmup, cfg.Duration = 100*time.Millisecond, 500*time.Millisecond
	s, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode != "rate" || s.TargetRate != 200 || s.Errors != 0 {
		t.Fatalf("mode %s rate %v errors %v", s.Mode, s.TargetRate, s.ErrorsByCode)
	}
	// 100 requests are due in the window; allow for a slow machine.
	if s.Certs < 70 || s.Certs > 110 {
		t.Errorf("%d certificates in 500ms at 200/s, want about 100", s.Certs)
	}
	for _, z := range cfg.Plan {
		if f.issuedCount(z.Token, z.Identities[0]) == 0 || f.issuedCount(z.Token, z.Identities[1]) == 0 {
			t.Errorf("%s: requests not spread over its identities", z.Token)
		}
	}
	checkOwnConnections(t, f, cfg.Plan)
}

// TestRunOpenLoopChargesQueueing checks that latency counts from when a
// request was due: a server that handles 50/s, offered 100/s, must show
// latencies well beyond its 20ms service time.
func TestRunOpenLoopChargesQueueing(t *testing.T) {
	f := &fakeCA{delay: 20 * time.Millisecond}
	cfg := startFake(t, f)
	cfg.Plan = plan(1, 1)
	cfg.InFlight, cfg.Rate = 1, 100
	cfg.Duration = 400 * time.Millisecond
	s, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.LatencyMS.Max < 100 {
		t.Errorf("max latency %.1fms: queueing behind a saturated server is not charged", s.LatencyMS.Max)
	}
	// Here the wait is in the client, for its one request in flight.
	if s.StartLagMS == nil || s.StartLagMS.Max < 100 {
		t.Errorf("start lag %+v: the wait to send is not reported", s.StartLagMS)
	}
	if got := f.maxInFlightOf("token-0"); got != 1 {
		t.Errorf("%d requests in flight, want 1", got)
	}
}

func TestRunErrorsByCode(t *testing.T) {
	f := &fakeCA{deny: map[string]bool{id("sa-0-1"): true}, wrongSAN: map[string]bool{id("sa-0-2"): true}}
	cfg := startFake(t, f)
	cfg.Plan = plan(1, 3)
	cfg.Duration = 200 * time.Millisecond
	s, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.Certs == 0 || s.ErrorsByCode["PermissionDenied"] == 0 || s.ErrorsByCode[ErrInvalidResponse] == 0 {
		t.Fatalf("certs %d, errors %v: want certificates, PermissionDenied and %s", s.Certs, s.ErrorsByCode, ErrInvalidResponse)
	}
	if s.Errors != s.ErrorsByCode["PermissionDenied"]+s.ErrorsByCode[ErrInvalidResponse] || len(s.ErrorsByCode) != 2 {
		t.Errorf("errors %d by code %v", s.Errors, s.ErrorsByCode)
	}
	b, err := json.Marshal(s)
	if err != nil || !strings.Contains(string(b), `"PermissionDenied":`) {
		t.Errorf("JSON %s, %v", b, err)
	}
	var text bytes.Buffer
	if err := s.WriteText(&text); err != nil || !strings.Contains(text.String(), "PermissionDenied=") {
		t.Errorf("text %q, %v", text.String(), err)
	}
}

func TestRunOnce(t *testing.T) {
	flakyID := id("sa-1-3")
	f := &fakeCA{delay: 2 * time.Millisecond, flaky: map[string]int{flakyID: 2}}
	cfg := startFake(t, f)
	cfg.Plan = plan(3, 12)
	cfg.Once = true
	cfg.Warmup = time.Hour // ignored
	s, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode != "once" || s.ZtunnelsDone != 3 || s.AllDoneSeconds <= 0 || s.AllDoneSeconds > 5 {
		t.Fatalf("mode %s, %d ztunnels done, all done after %vs", s.Mode, s.ZtunnelsDone, s.AllDoneSeconds)
	}
	if s.Certs != 36 || s.Errors != 2 || s.ErrorsByCode["Unavailable"] != 2 {
		t.Errorf("certs %d, errors %v: want 36 and 2 Unavailable (retried)", s.Certs, s.ErrorsByCode)
	}
	for _, z := range cfg.Plan {
		for _, ident := range z.Identities {
			if n := f.issuedCount(z.Token, ident); n != 1 {
				t.Errorf("%s got %s %d times, want once", z.Token, ident, n)
			}
		}
		if got := f.maxInFlightOf(z.Token); got > 8 {
			t.Errorf("%s: %d requests in flight, want at most 8", z.Token, got)
		}
	}
	checkOwnConnections(t, f, cfg.Plan)
}

// TestRunOnceBacksOffLikeZtunnel: an identity that fails is asked for
// again after about a second, then two (20% either way), and meanwhile
// gives its slot up to the ztunnel's other identities. The goodput curve
// counts every answer in its second.
func TestRunOnceBacksOffLikeZtunnel(t *testing.T) {
	flaky := id("sa-0-0")
	f := &fakeCA{flaky: map[string]int{flaky: 2}}
	cfg := startFake(t, f)
	cfg.Plan, cfg.Once, cfg.InFlight = plan(1, 3), true, 1
	began := time.Now()
	s, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.ZtunnelsDone != 1 || s.Certs != 3 || s.Errors != 2 || s.Retry != RetryZtunnel {
		t.Fatalf("%d done, %d certs, %d errors, retry %q; want 1, 3, 2, ztunnel", s.ZtunnelsDone, s.Certs, s.Errors, s.Retry)
	}
	f.mu.Lock()
	failed, done := f.failedAt[flaky], f.issuedAt[flaky]
	others := []time.Time{f.issuedAt[id("sa-0-1")], f.issuedAt[id("sa-0-2")]}
	f.mu.Unlock()
	for i, want := range []time.Duration{time.Second, 2 * time.Second} {
		next := done
		if i+1 < len(failed) {
			next = failed[i+1]
		}
		if gap := next.Sub(failed[i]); gap < want*8/10 || gap > want*12/10+100*time.Millisecond {
			t.Errorf("retry %d came %v after the failure, want %v ±20%%", i+1, gap, want)
		}
	}
	for _, at := range others {
		if at.Sub(began) > 500*time.Millisecond {
			t.Errorf("another identity was issued %v into the storm: it waited for the flaky one's backoff", at.Sub(began))
		}
	}
	if sumOf(s.CertsPerSecond) != s.Certs || sumOf(s.ErrorsPerSecond) != s.Errors || len(s.CertsPerSecond) < 3 {
		t.Errorf("per second: certs %v, errors %v; want them to add up to %d and %d over 3 s or more",
			s.CertsPerSecond, s.ErrorsPerSecond, s.Certs, s.Errors)
	}
}

// TestRunOnceAggressiveRetriesAtOnce: with RetryAggressive a failure is
// retried at once.
func TestRunOnceAggressiveRetriesAtOnce(t *testing.T) {
	flaky := id("sa-0-0")
	f := &fakeCA{flaky: map[string]int{flaky: 20}}
	cfg := startFake(t, f)
	cfg.Plan, cfg.Once, cfg.Retry = plan(1, 2), true, RetryAggressive
	s, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.ZtunnelsDone != 1 || s.Errors != 20 || s.AllDoneSeconds > 1 {
		t.Errorf("%d done, %d errors, all done after %vs; want 1, 20, under a second", s.ZtunnelsDone, s.Errors, s.AllDoneSeconds)
	}
}

func sumOf(v []uint64) uint64 {
	var n uint64
	for _, x := range v {
		n += x
	}
	return n
}

func TestRunOnceGivesUp(t *testing.T) {
	f := &fakeCA{deny: map[string]bool{id("sa-0-0"): true}}
	cfg := startFake(t, f)
	cfg.Plan = plan(2, 1)
	cfg.Once, cfg.Duration = true, 300*time.Millisecond
	s, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.ZtunnelsDone != 1 || s.AllDoneSeconds != 0 || s.ErrorsByCode["PermissionDenied"] == 0 {
		t.Errorf("%d ztunnels done, all done %v, errors %v", s.ZtunnelsDone, s.AllDoneSeconds, s.ErrorsByCode)
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	cfg := startFake(t, &fakeCA{})
	for name, mutate := range map[string]func(*Config){
		"no plan":       func(c *Config) { c.Plan = nil },
		"no duration":   func(c *Config) { c.Duration = 0 },
		"negative rate": func(c *Config) { c.Rate = -1 },
		"no roots":      func(c *Config) { c.Roots = nil },
	} {
		c := cfg
		c.Plan, c.Duration = plan(1, 1), time.Second
		mutate(&c)
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestRunFailsWhenUnreachable(t *testing.T) {
	cfg := startFake(t, &fakeCA{})
	cfg.Address = "127.0.0.1:1"
	cfg.Plan, cfg.Duration, cfg.Timeout = plan(1, 1), time.Second, 300*time.Millisecond
	if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("err = %v, want a connection that is not ready", err)
	}
}

func TestRunSendsEachZtunnelsCluster(t *testing.T) {
	f := &fakeCA{}
	cfg := startFake(t, f)
	cfg.Plan = plan(2, 1)
	cfg.Plan[1].ClusterID = "east"
	cfg.Warmup, cfg.Duration = 0, 100*time.Millisecond
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	for token, want := range map[string]string{"token-0": "Kubernetes", "token-1": "east"} {
		if got := f.clusterOf(token); got != want {
			t.Errorf("%s sent clusterid %q, want %q", token, got, want)
		}
	}
}
