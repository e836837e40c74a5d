package promserver

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

// envControlPlane is controlplane.EnvBinDir: `make e2e` sets it, and with
// it the Prometheus tools are required, not optional.
const envControlPlane = "WORKLOAD_CA_CONTROLPLANE_BIN"

// tools returns prometheus and promtool, failing the test under `make e2e`
// and skipping it elsewhere when they are missing.
func tools(t *testing.T) (prometheus, promtool string) {
	t.Helper()
	prometheus, promtool, err := LookPath()
	if err != nil {
		if os.Getenv(envControlPlane) != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return prometheus, promtool
}

const exposition = `# HELP demo_requests_total Requests.
# TYPE demo_requests_total counter
demo_requests_total{result="issued",reason=""} 3
demo_requests_total{result="denied",reason="not-on-node"} 1
# HELP demo_up Up.
# TYPE demo_up gauge
demo_up 1
demo_odd{a="x\\y",b="say \"hi\"\n", } +Inf 1700000000000
`

func TestParseText(t *testing.T) {
	ss, err := ParseText([]byte(exposition))
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 4 {
		t.Fatalf("%d samples, want 4: %+v", len(ss), ss)
	}
	if v, n := ss.Sum("demo_requests_total"); v != 4 || n != 2 {
		t.Errorf("sum %v over %d", v, n)
	}
	if v, n := ss.Sum("demo_requests_total", "result", "denied", "reason", "not-on-node"); v != 1 || n != 1 {
		t.Errorf("denied: %v over %d", v, n)
	}
	if v, n := ss.Sum("demo_up"); v != 1 || n != 1 {
		t.Errorf("demo_up %v over %d", v, n)
	}
	odd := ss.Match("demo_odd")
	if len(odd) != 1 || odd[0].Labels["a"] != `x\y` || odd[0].Labels["b"] != "say \"hi\"\n" || odd[0].Value < 1e308 {
		t.Errorf("demo_odd %+v", odd)
	}
	for _, bad := range []string{`x{a="b} 1`, `x{a=b} 1`, `x`, `x 1 2 3`, `x{a="1",a="2"} 1`, `x one`} {
		if _, err := ParseText([]byte(bad + "\n")); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestCheckMetrics(t *testing.T) {
	_, promtool := tools(t)
	ctx := t.Context()
	complaints, err := CheckMetrics(ctx, promtool, []byte(strings.SplitAfter(exposition, "demo_up 1\n")[0]))
	if err != nil || len(complaints) != 0 {
		t.Errorf("clean exposition: complaints %q, err %v", complaints, err)
	}
	complaints, err = CheckMetrics(ctx, promtool, []byte("# HELP x_count X.\n# TYPE x_count counter\nx_count 1\n"))
	if err != nil || len(complaints) == 0 || !strings.Contains(strings.Join(complaints, "\n"), `"_total" suffix`) {
		t.Errorf("counter without _total: complaints %q, err %v", complaints, err)
	}
	if _, err := CheckMetrics(ctx, promtool, []byte("garbage{{\n")); err == nil {
		t.Error("no error for an unparsable exposition")
	}
}

// TestServerScrapes starts Prometheus against a fixed exposition and
// queries it back.
func TestServerScrapes(t *testing.T) {
	prometheus, _ := tools(t)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, exposition)
	}))
	defer target.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	began := time.Now()
	srv, err := Start(ctx, Options{Binary: prometheus, WorkDir: t.TempDir(), Job: "demo",
		Targets: []string{strings.TrimPrefix(target.URL, "http://")}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	t.Logf("prometheus ready in %v", time.Since(began).Round(time.Millisecond))
	var got []Result
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if got, err = srv.Query(ctx, `demo_requests_total{job="demo",result="issued"}`); err == nil && len(got) == 1 {
			break
		}
		if time.Now().After(deadline) {
			targets, _ := srv.Targets(ctx)
			t.Fatalf("no sample after 30s: %v, %v; targets %+v; output:\n%s", got, err, targets, srv.Tail())
		}
	}
	if got[0].Value != 3 || got[0].Metric["instance"] == "" {
		t.Errorf("query result %+v", got)
	}
	if _, err := srv.Query(ctx, "sum("); err == nil {
		t.Error("a bad query gave no error")
	}
}
