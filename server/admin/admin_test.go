package admin_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/server/admin"
)

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "workload_ca_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Inc()
	synced := false
	srv := admin.New(admin.Config{Gatherer: reg, Readiness: admin.NewReadiness(
		admin.Check{Name: "pod-index", Check: func(context.Context) error {
			if !synced {
				return errors.New("not synced")
			}
			return nil
		}},
	)})
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	tests := []struct {
		name     string
		path     string
		before   func()
		wantCode int
		wantBody string
	}{
		{name: "alive", path: "/healthz", wantCode: 200, wantBody: "ok"},
		{name: "not ready names the failing check", path: "/readyz", wantCode: 503, wantBody: "pod-index: not synced"},
		{name: "ready", path: "/readyz", before: func() { synced = true }, wantCode: 200, wantBody: "ok"},
		{name: "metrics", path: "/metrics", wantCode: 200, wantBody: "workload_ca_test_total 1"},
		{name: "pprof off by default", path: "/debug/pprof/", wantCode: 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.before != nil {
				tt.before()
			}
			resp, err := http.Get(ts.URL + tt.path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.wantCode || !strings.Contains(string(body), tt.wantBody) {
				t.Fatalf("GET %s = %d %q, want %d containing %q", tt.path, resp.StatusCode, body, tt.wantCode, tt.wantBody)
			}
		})
	}
}

func TestCached(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	calls := 0
	check := admin.Cached(func(context.Context) error { calls++; return nil }, 10*time.Second, clk)
	ctx := context.Background()
	_ = check(ctx)
	_ = check(ctx)
	clk.Step(5 * time.Second)
	_ = check(ctx)
	if calls != 1 {
		t.Fatalf("calls within ttl = %d, want 1", calls)
	}
	clk.Step(6 * time.Second)
	_ = check(ctx)
	if calls != 2 {
		t.Fatalf("calls after ttl = %d, want 2", calls)
	}
}

// A check that fails because its caller went away is not cached: the next
// caller, with a live context, runs the check again.
func TestCachedIgnoresCancelledCallers(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	calls := 0
	check := admin.Cached(func(ctx context.Context) error { calls++; return ctx.Err() }, 10*time.Second, clk)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := check(cancelled); err == nil {
		t.Fatal("the cancelled caller got no error")
	}
	if err := check(context.Background()); err != nil || calls != 2 {
		t.Fatalf("next caller: %v after %d calls; want nil after a second call", err, calls)
	}
}
