package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// results are the metrics of a run by key, the JSON written for comparing
// commits (a flat object, keys sorted).
type results map[string]any

func (r results) set(key string, v any) { r[key] = v }

// num returns a numeric metric.
func (r results) num(key string) (float64, bool) {
	switch v := r[key].(type) {
	case float64:
		return v, true
	case int:
		return float64(v), true
	case uint64:
		return float64(v), true
	}
	return 0, false
}

// meta records what the numbers were measured on.
func (r results) meta() {
	r.set("timestamp", time.Now().UTC().Format(time.RFC3339))
	r.set("go_version", runtime.Version())
	r.set("cpus", runtime.NumCPU())
	r.set("load_avg_1m_start", loadAvg())
	if out, err := exec.Command("git", "describe", "--tags", "--always", "--dirty").Output(); err == nil {
		r.set("commit", strings.TrimSpace(string(out)))
	}
}

// loadAvg returns the one-minute load average, -1 if unknown: a busy
// machine makes every number here worse, so the results say how busy.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

func (r results) write(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o600)
}

// row is one line of the table: a metric, its format, and its target if it
// has one.
type row struct {
	key    string
	format string
	target string
	ok     func(v float64) bool
}

// tableSummary says how many targets were missed (or not measured).
type tableSummary struct{ missed int }

// table prints the metrics with their targets to stdout; with
// measuredOnly, only those measured (a run of some phases only).
func (r results) table(measuredOnly bool) tableSummary {
	distinct, _ := r.num("storm_distinct_tokens")
	planned, _ := r.num("storm_planned_certs")
	podList, _ := r.num("pod_list_seconds")
	zero := func(v float64) bool { return v == 0 }
	rows := []row{
		{key: "floor_certs_per_sec_per_core", format: "%.0f"},
		{key: "floor_start_certs_per_sec_per_core", format: "%.0f"},
		{key: "floor_before_certs_per_sec_per_core", format: "%.0f"},
		{key: "floor_after_certs_per_sec_per_core", format: "%.0f"},
		{key: "floor_wall_certs_per_sec", format: "%.0f"},
		{key: "floor_rsa2048_certs_per_sec_per_core", format: "%.0f"},
		{key: "e2e_ztunnels", format: "%.0f"},
		{key: "e2e_identities", format: "%.0f"},
		{key: "e2e_certs_per_sec", format: "%.1f"},
		{key: "e2e_server_cores_used", format: "%.2f"},
		{key: "e2e_client_cores_used", format: "%.2f"},
		{key: "e2e_apiserver_cores_used", format: "%.2f"},
		{key: "e2e_etcd_cores_used", format: "%.2f"},
		{key: "cpu_seconds_per_cert", format: "%.6f"},
		{key: "e2e_certs_per_server_cpu_second", format: "%.0f"},
		{key: "e2e_ratio_to_floor", format: "%.2f", target: ">= 0.70", ok: func(v float64) bool { return v >= 0.70 }},
		{key: "e2e_p50_ms", format: "%.2f"},
		{key: "e2e_p99_ms", format: "%.2f"},
		{key: "e2e_p99_9_ms", format: "%.2f"},
		{key: "e2e_errors", format: "%.0f", target: "0", ok: zero},
		{key: "e2e_cpu_steal_percent", format: "%.1f"},
		{key: "e2e_cpu_steal_percent_server_cpus", format: "%.1f"},
		{key: "half_rate_target", format: "%.1f"},
		{key: "half_rate_certs_per_sec", format: "%.1f"},
		{key: "half_rate_server_cores_used", format: "%.2f"},
		{key: "half_rate_client_cores_used", format: "%.2f"},
		{key: "p50_ms_at_half_rate", format: "%.2f"},
		{key: "p99_ms_at_half_rate", format: "%.2f", target: "<= 10", ok: func(v float64) bool { return v <= 10 }},
		{key: "service_p50_ms_at_half_rate", format: "%.2f"},
		{key: "service_p99_ms_at_half_rate", format: "%.2f"},
		{key: "client_start_lag_p50_ms_at_half_rate", format: "%.2f"},
		{key: "client_start_lag_p99_ms_at_half_rate", format: "%.2f"},
		{key: "p99_9_ms_at_half_rate", format: "%.2f"},
		{key: "half_rate_cpu_steal_percent", format: "%.1f"},
		{key: "half_rate_cpu_steal_percent_server_cpus", format: "%.1f"},
		{key: "half_rate_cpu_steal_percent_client_cpus", format: "%.1f"},
		{key: "half_rate_gc_cycles_per_sec", format: "%.1f"},
		{key: "half_rate_gc_cpu_ms_per_cycle", format: "%.1f"},
		{key: "half_rate_errors", format: "%.0f", target: "0", ok: zero},
		{key: "two_cluster_one_cluster_certs_per_sec", format: "%.1f"},
		{key: "two_cluster_certs_per_sec", format: "%.1f"},
		{key: "two_cluster_rate_ratio", format: "%.3f", target: ">= 0.90", ok: func(v float64) bool { return v >= 0.90 }},
		{key: "two_cluster_errors", format: "%.0f", target: "0", ok: zero},
		{key: "upstream_local_root_certs_per_sec", format: "%.1f"},
		{key: "upstream_certs_per_sec", format: "%.1f"},
		{key: "upstream_rate_ratio", format: "%.3f", target: ">= 0.95", ok: func(v float64) bool { return v >= 0.95 }},
		{key: "upstream_errors", format: "%.0f", target: "0", ok: zero},
		{key: "policies_0_certs_per_sec", format: "%.1f"},
		{key: "policies_1_certs_per_sec", format: "%.1f"},
		{key: "policies_1_rate_ratio", format: "%.3f"},
		{key: "policies_50_certs_per_sec", format: "%.1f"},
		{key: "policies_50_rate_ratio", format: "%.3f", target: ">= 0.95", ok: func(v float64) bool { return v >= 0.95 }},
		{key: "policies_errors", format: "%.0f", target: "0", ok: zero},
		{key: "storm_rounds", format: "%.0f"},
		{key: "storm_ztunnels", format: "%.0f"},
		{key: "storm_planned_certs", format: "%.0f"},
		{key: "storm_certs", format: "%.0f", target: fmt.Sprintf("= %.0f (planned)", planned), ok: func(v float64) bool { return planned > 0 && v == planned }},
		{key: "storm_distinct_tokens", format: "%.0f"},
		{key: "storm_tokenreviews", format: "%.0f", target: fmt.Sprintf("<= %.0f (distinct tokens)", distinct), ok: func(v float64) bool { return distinct > 0 && v <= distinct }},
		{key: "storm_seconds", format: "%.3f", target: "<= 60 (median)", ok: func(v float64) bool { return v > 0 && v <= 60 }},
		{key: "storm_seconds_min", format: "%.3f"},
		{key: "storm_seconds_max", format: "%.3f"},
		{key: "storm_floor_certs_per_cpu_second", format: "%.0f"},
		{key: "storm_floor_seconds", format: "%.1f"},
		{key: "storm_floor_efficiency", format: "%.2f"},
		{key: "storm_p99_ms", format: "%.2f"},
		{key: "storm_errors", format: "%.0f"},
		{key: "storm_leader_changes", format: "%.0f", target: "0", ok: zero},
		{key: "storm_server_cpu_seconds", format: "%.1f"},
		{key: "storm_control_plane_cpu_seconds", format: "%.1f"},
		{key: "storm_ca_rss_mib_end", format: "%.0f"},
		{key: "storm_ca_rss_mib_peak", format: "%.0f"},
		{key: "storm_peak_goroutines", format: "%.0f"},
		{key: "storm_peak_stack_mib", format: "%.0f"},
		{key: "storm_peak_heap_mib", format: "%.0f"},
		{key: "idle_connections", format: "%.0f"},
		{key: "idle_bytes_per_connection", format: "%.0f", target: "<= 65536", ok: func(v float64) bool { return v <= 65536 }},
		{key: "idle_rss_bytes_per_connection", format: "%.0f"},
		{key: "idle_goroutines_per_connection", format: "%.1f"},
		{key: "storm_aggressive_certs", format: "%.0f", target: fmt.Sprintf("= %.0f (planned)", planned), ok: func(v float64) bool { return planned > 0 && v == planned }},
		{key: "storm_aggressive_seconds", format: "%.3f"},
		{key: "storm_aggressive_seconds_min", format: "%.3f"},
		{key: "storm_aggressive_seconds_max", format: "%.3f"},
		{key: "storm_aggressive_floor_efficiency", format: "%.2f"},
		{key: "storm_aggressive_errors", format: "%.0f"},
		{key: "storm_aggressive_tokenreviews", format: "%.0f", target: fmt.Sprintf("<= %.0f (distinct tokens)", distinct), ok: func(v float64) bool { return distinct > 0 && v <= distinct }},
		{key: "storm_aggressive_leader_changes", format: "%.0f", target: "0", ok: zero},
		{key: "storm_aggressive_to_ztunnel_ratio", format: "%.2f", target: "<= 1.5", ok: func(v float64) bool { return v <= 1.5 }},
		{key: "storm_compare_seconds", format: "%.3f"},
		{key: "storm_compare_seconds_min", format: "%.3f"},
		{key: "storm_compare_seconds_max", format: "%.3f"},
		{key: "storm_compare_floor_efficiency", format: "%.2f"},
		{key: "storm_compare_certs", format: "%.0f", target: fmt.Sprintf("= %.0f (planned)", planned), ok: func(v float64) bool { return planned > 0 && v == planned }},
		{key: "storm_compare_errors", format: "%.0f"},
		{key: "storm_compare_server_cpu_seconds", format: "%.1f"},
		{key: "storm_compare_ca_rss_mib_peak", format: "%.0f"},
		{key: "storm_compare_to_base_ratio", format: "%.3f"},
		{key: "podindex_bytes_per_pod", format: "%.1f", target: "<= 100", ok: func(v float64) bool { return v <= 100 }},
		{key: "podindex_relist_bytes_per_pod", format: "%.1f"},
		{key: "podindex_rss_mib", format: "%.1f"},
		{key: "podindex_rss_bytes_per_pod", format: "%.1f"},
		{key: "pods_in_cluster", format: "%.0f"},
		{key: "fixture_seconds", format: "%.1f"},
		{key: "pod_list_seconds", format: "%.3f"},
		{key: "start_to_ready_seconds", format: "%.3f", target: fmt.Sprintf("<= 2 + pod list = %.2f", 2+podList), ok: func(v float64) bool { return v <= 2+podList }},
		{key: "start_to_readyz_seconds", format: "%.3f"},
		{key: "restart_to_ready_seconds", format: "%.3f"},
		{key: "restart_to_readyz_seconds", format: "%.3f"},
		{key: "restart_aggressive_to_ready_seconds", format: "%.3f"},
		{key: "load_avg_1m_start", format: "%.2f"},
		{key: "load_avg_1m_end", format: "%.2f"},
	}
	var s tableSummary
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "metric\tvalue\ttarget\tok?")
	for _, k := range []string{"placement", "server_cpus", "client_cpus"} {
		if v, ok := r[k].(string); ok {
			fmt.Fprintf(tw, "%s\t%s\t\t\n", k, v)
		}
	}
	for _, rw := range rows {
		v, have := r.num(rw.key)
		if !have && measuredOnly {
			continue
		}
		value, verdict := "-", ""
		if have {
			value = fmt.Sprintf(rw.format, v)
		}
		if rw.ok != nil {
			switch {
			case !have:
				verdict = "NOT MEASURED"
				s.missed++
			case rw.ok(v):
				verdict = "ok"
			default:
				verdict = "MISSED"
				s.missed++
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", rw.key, value, rw.target, verdict)
	}
	_ = tw.Flush()
	return s
}
