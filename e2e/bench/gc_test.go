package main

import (
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/e2e/internal/promserver"
)

const scrapeText = `# HELP go_gc_duration_seconds A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0"} 4.1e-05
go_gc_duration_seconds{quantile="1"} 0.00012
go_gc_duration_seconds_sum 0.0031
go_gc_duration_seconds_count 42
# HELP go_cpu_classes_gc_total_cpu_seconds_total Estimated total CPU time spent performing GC tasks.
# TYPE go_cpu_classes_gc_total_cpu_seconds_total counter
go_cpu_classes_gc_total_cpu_seconds_total 0.21
# HELP workload_ca_leader 1 while this replica holds the leader lease.
# TYPE workload_ca_leader gauge
workload_ca_leader 1
`

// parseGCCounters reads the counters from a scrape's text.
func parseGCCounters(scrape []byte, at time.Time) (gcCounters, error) {
	samples, err := promserver.ParseText(scrape)
	if err != nil {
		return gcCounters{}, err
	}
	return gcCountersOf(samples, at)
}

func TestGCCountersOf(t *testing.T) {
	at := time.Unix(100, 0)
	c, err := parseGCCounters([]byte(scrapeText), at)
	if err != nil {
		t.Fatal(err)
	}
	if c.cycles != 42 || c.cpu != 0.21 || !c.at.Equal(at) {
		t.Errorf("got %+v, want 42 cycles and 0.21 CPU seconds at %v", c, at)
	}
	for _, missing := range []string{"go_gc_duration_seconds", "go_cpu_classes_gc_total_cpu_seconds_total"} {
		var kept []string // the scrape without the family
		for _, l := range strings.Split(scrapeText, "\n") {
			if !strings.Contains(l, missing) {
				kept = append(kept, l)
			}
		}
		if _, err := parseGCCounters([]byte(strings.Join(kept, "\n")), at); err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("without %s: got error %v, want one naming it", missing, err)
		}
	}
}

func TestGCRates(t *testing.T) {
	t0 := time.Unix(100, 0)
	for _, tc := range []struct {
		name          string
		a, b          gcCounters
		perSec, cpuMS float64
		ok            bool
	}{
		{"ten cycles in four seconds, 5 ms each", gcCounters{t0, 32, 0.15}, gcCounters{t0.Add(4 * time.Second), 42, 0.2}, 2.5, 5, true},
		{"no cycle completed", gcCounters{t0, 42, 0.2}, gcCounters{t0.Add(time.Second), 42, 0.2}, 0, 0, false},
		{"no time passed", gcCounters{t0, 41, 0.1}, gcCounters{t0, 42, 0.2}, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			perSec, cpuMS, ok := gcRates(tc.a, tc.b)
			if ok != tc.ok || !near(perSec, tc.perSec) || !near(cpuMS, tc.cpuMS) {
				t.Errorf("got %v/s, %v ms, ok %v; want %v/s, %v ms, ok %v", perSec, cpuMS, ok, tc.perSec, tc.cpuMS, tc.ok)
			}
		})
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
