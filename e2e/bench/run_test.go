package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/workload-ca/workload-ca/e2e/cahost"
)

// TestBenchRuns runs the whole bench, briefly and without the pod index,
// against a real control plane and the built binary: it finishes without
// error and writes the keys that runs are compared on. It checks no
// target; the numbers of so short a run say nothing.
func TestBenchRuns(t *testing.T) {
	if v := cahost.MissingEnv(); v != "" {
		t.Skipf("%s is unset: run `make e2e`", v)
	}
	out := filepath.Join(t.TempDir(), "bench-results.json")
	code := mainCode(t.Context(), []string{"--out", out, "--podindex=false",
		"--ztunnels", "4", "--identities", "3", "--storm-ztunnels", "4", "--storm-identities", "3",
		"--duration", "2s", "--warmup", "500ms", "--half-warmup", "500ms", "--floor-time", "300ms", "--two-cluster-rounds", "1", "--upstream-rounds", "1",
		"--policy-rounds", "1", "--policy-crd", "../../deploy/charts/workload-ca/crds/workload-ca.io_issuancepolicies.yaml"})
	if code != 0 {
		t.Fatalf("bench exited %d", code)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res map[string]any
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{
		"floor_certs_per_sec_per_core", "e2e_certs_per_sec", "e2e_server_cores_used", "e2e_ratio_to_floor",
		"p99_ms_at_half_rate", "storm_distinct_tokens", "start_to_ready_seconds",
		"half_rate_certs_per_sec", "service_p99_ms_at_half_rate", "idle_bytes_per_connection",
		"two_cluster_certs_per_sec", "two_cluster_one_cluster_certs_per_sec", "two_cluster_rate_ratio",
		"policies_0_certs_per_sec", "policies_50_certs_per_sec", "policies_50_rate_ratio",
		"upstream_certs_per_sec", "upstream_local_root_certs_per_sec", "upstream_rate_ratio",
	} {
		if v, ok := res[key].(float64); !ok || v <= 0 {
			t.Errorf("%s = %v, want a positive number", key, res[key])
		}
	}
	distinct, _ := res["storm_distinct_tokens"].(float64)
	for _, key := range []string{"storm_tokenreviews", "storm_aggressive_tokenreviews"} {
		if v, ok := res[key].(float64); !ok || v < 0 || v > distinct {
			t.Errorf("%s = %v, want 0 to storm_distinct_tokens (%v)", key, res[key], res["storm_distinct_tokens"])
		}
	}
	for _, key := range []string{"e2e_errors", "half_rate_errors", "storm_leader_changes", "storm_aggressive_leader_changes", "two_cluster_errors", "upstream_errors"} {
		if v, ok := res[key].(float64); !ok || v != 0 {
			t.Errorf("%s = %v, want 0", key, res[key])
		}
	}
	for _, key := range []string{"storm_certs", "storm_aggressive_certs"} {
		if res[key] != res["storm_planned_certs"] {
			t.Errorf("%s = %v, want every planned certificate (%v)", key, res[key], res["storm_planned_certs"])
		}
	}
	if curve, ok := res["storm_certs_per_second"].([]any); !ok || len(curve) == 0 {
		t.Errorf("storm_certs_per_second = %v, want the goodput curve", res["storm_certs_per_second"])
	}
	if _, err := os.Stat(strings.TrimSuffix(out, ".json") + "-storm.png"); err != nil {
		t.Errorf("goodput plot: %v", err)
	}
	// The half-rate window may see no collection end; when it does, both
	// numbers are there.
	if _, cycles := res["half_rate_gc_cycles_per_sec"]; cycles {
		if v, ok := res["half_rate_gc_cpu_ms_per_cycle"].(float64); !ok || v <= 0 {
			t.Errorf("half_rate_gc_cpu_ms_per_cycle = %v with half_rate_gc_cycles_per_sec set", res["half_rate_gc_cpu_ms_per_cycle"])
		}
	}
}

// TestStormSmallCluster runs the cold-start storms at 500 nodes × 10
// identities against a real control plane and checks correctness only
// (the times of so small a storm on a shared machine say little): every
// certificate issued with either retry policy, no more TokenReviews than
// tokens, no change of leader.
func TestStormSmallCluster(t *testing.T) {
	if v := cahost.MissingEnv(); v != "" {
		t.Skipf("%s is unset: run `make e2e`", v)
	}
	out := filepath.Join(t.TempDir(), "bench-results.json")
	code := mainCode(t.Context(), []string{"--out", out, "--storm-only", "--storm-ztunnels", "500", "--storm-identities", "10"})
	if code != 0 {
		t.Fatalf("bench exited %d", code)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res map[string]any
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	for _, storm := range []string{"storm_", "storm_aggressive_"} {
		if got := res[storm+"certs"]; got != float64(5000) {
			t.Errorf("%scerts = %v, want 5000", storm, got)
		}
		if got, ok := res[storm+"tokenreviews"].(float64); !ok || got > 500 {
			t.Errorf("%stokenreviews = %v, want at most the 500 tokens", storm, res[storm+"tokenreviews"])
		}
		if got := res[storm+"leader_changes"]; got != float64(0) {
			t.Errorf("%sleader_changes = %v, want 0", storm, got)
		}
	}
	t.Logf("storm %.1fs, aggressive %.1fs, %v TokenReviews, %.0f B per idle connection",
		res["storm_seconds"], res["storm_aggressive_seconds"], res["storm_tokenreviews"], res["idle_bytes_per_connection"])
}
