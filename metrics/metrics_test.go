package metrics_test

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/workload-ca/workload-ca/metrics"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, metrics.Options{IstioCompat: true})
	m.RequestDone("grpc", "issued", "", 2*time.Millisecond)
	m.RequestDone("grpc", "denied", "identity-not-on-node", time.Millisecond)
	m.RequestDone("podcert", "issued", "", time.Millisecond)
	m.ReviewDone("authenticated", 3*time.Millisecond)
	m.CacheLookup(true)
	m.CacheLookup(false)
	m.Published("created")
	m.RootConfigMaps().Published("updated")
	m.Rotated("prepare")
	m.SetLeader(true)
	root := &x509.Certificate{NotAfter: time.Unix(2000000000, 0)}
	newRoot := &x509.Certificate{NotAfter: time.Unix(2100000000, 0)}
	metrics.WatchCA(reg, func() metrics.CAState {
		return metrics.CAState{Signing: root, Roots: []*x509.Certificate{root, newRoot}, Serving: root, Phase: "prepared",
			NextStep: "activate", NextStepAt: time.Unix(1.9e9, 0)}
	})
	metrics.WatchPodIndex(reg, func() metrics.PodIndexStats {
		return metrics.PodIndexStats{Synced: true, Pods: 7, Nodes: 2, ServiceAccounts: 3, Lookups: 4, LookupsRefused: 1}
	})

	want := `
# HELP workload_ca_certificate_requests_total Certificate requests by front door (grpc, podcert), result (issued, unauthenticated, denied, invalid, unavailable, canceled, internal) and denial reason.
# TYPE workload_ca_certificate_requests_total counter
workload_ca_certificate_requests_total{door="grpc",reason="",result="issued"} 1
workload_ca_certificate_requests_total{door="grpc",reason="identity-not-on-node",result="denied"} 1
workload_ca_certificate_requests_total{door="podcert",reason="",result="issued"} 1
# HELP workload_ca_ca_cert_expiry_timestamp_seconds NotAfter of the CA certificates as a Unix time, by kind (signing, root, intermediate).
# TYPE workload_ca_ca_cert_expiry_timestamp_seconds gauge
workload_ca_ca_cert_expiry_timestamp_seconds{kind="root"} 2.1e+09
workload_ca_ca_cert_expiry_timestamp_seconds{kind="signing"} 2e+09
# HELP workload_ca_rotation_phase 1 for the current CA rotation phase.
# TYPE workload_ca_rotation_phase gauge
workload_ca_rotation_phase{phase="prepared"} 1
workload_ca_rotation_phase{phase="retiring"} 0
workload_ca_rotation_phase{phase="steady"} 0
# HELP workload_ca_rotation_next_step_timestamp_seconds When the rotation plan's next step is due, as a Unix time, by step; one far in the past is a rotation that is stuck.
# TYPE workload_ca_rotation_next_step_timestamp_seconds gauge
workload_ca_rotation_next_step_timestamp_seconds{step="activate"} 1.9e+09
# HELP workload_ca_podindex_pods Live scheduled pods in the pod index.
# TYPE workload_ca_podindex_pods gauge
workload_ca_podindex_pods 7
# HELP workload_ca_tokenreview_cache_lookups_total Token review cache lookups by result (hit, miss).
# TYPE workload_ca_tokenreview_cache_lookups_total counter
workload_ca_tokenreview_cache_lookups_total{result="hit"} 1
workload_ca_tokenreview_cache_lookups_total{result="miss"} 1
# HELP workload_ca_root_configmap_publish_total Reconciliations of Istio's istio-ca-root-cert ConfigMap, one per namespace, by result (created, updated, repaired, deferred, unchanged, skipped, requeued, error).
# TYPE workload_ca_root_configmap_publish_total counter
workload_ca_root_configmap_publish_total{result="updated"} 1
# HELP workload_ca_leader 1 while this replica holds the leader lease.
# TYPE workload_ca_leader gauge
workload_ca_leader 1
# HELP citadel_server_authentication_failure_count The number of authentication failures (istiod-compatible).
# TYPE citadel_server_authentication_failure_count counter
citadel_server_authentication_failure_count 1
`
	names := []string{"workload_ca_certificate_requests_total", "workload_ca_ca_cert_expiry_timestamp_seconds",
		"workload_ca_rotation_phase", "workload_ca_rotation_next_step_timestamp_seconds", "workload_ca_podindex_pods", "workload_ca_tokenreview_cache_lookups_total",
		"workload_ca_root_configmap_publish_total", "workload_ca_leader", "citadel_server_authentication_failure_count"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		// istiod's legacy names are kept as they are on purpose.
		if !strings.HasPrefix(p.Metric, "citadel_server_") {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

func TestIstioCompatOffByDefault(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, metrics.Options{})
	m.RequestDone("grpc", "issued", "", time.Millisecond)
	if n, err := testutil.GatherAndCount(reg, "citadel_server_csr_count"); err != nil || n != 0 {
		t.Fatalf("citadel metrics exported without the option: %d, %v", n, err)
	}
}

// The Go runtime's garbage collector CPU and scheduling latency are
// exported, besides the collector's defaults.
func TestRuntimeMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics.New(reg, metrics.Options{})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]string{}
	for _, f := range families {
		types[f.GetName()] = f.GetType().String()
	}
	for name, typ := range map[string]string{
		"go_cpu_classes_gc_total_cpu_seconds_total": "COUNTER",
		"go_sched_latencies_seconds":                "HISTOGRAM",
		"go_gc_duration_seconds":                    "SUMMARY",
		"go_goroutines":                             "GAUGE",
		"process_cpu_seconds_total":                 "COUNTER",
	} {
		if got, ok := types[name]; !ok {
			t.Errorf("%s is not exported", name)
		} else if got != typ {
			t.Errorf("%s is a %s, want a %s", name, got, typ)
		}
	}
}

func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics.New(reg, metrics.Options{Build: metrics.BuildInfo{Version: "v1.2.3", Revision: "abc123", GoVersion: "go1.26.8"}})
	want := `# HELP workload_ca_build_info 1, labelled with the running build: version, VCS revision, Go version.
# TYPE workload_ca_build_info gauge
workload_ca_build_info{go_version="go1.26.8",revision="abc123",version="v1.2.3"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "workload_ca_build_info"); err != nil {
		t.Fatal(err)
	}
}

// The expiry gauges Istio's dashboards read: the newest root, and the
// first of the chain to end.
func TestWatchCAIstio(t *testing.T) {
	at := func(sec int64) *x509.Certificate { return &x509.Certificate{NotAfter: time.Unix(sec, 0)} }
	reg := prometheus.NewRegistry()
	metrics.WatchCAIstio(reg, func() metrics.CAState {
		return metrics.CAState{Signing: at(3000), Intermediates: []*x509.Certificate{at(2000)}, Roots: []*x509.Certificate{at(5000), at(9000)}}
	})
	want := `# HELP citadel_server_cert_chain_expiry_timestamp The unix timestamp, in seconds, when the CA certificate chain will expire (istiod-compatible).
# TYPE citadel_server_cert_chain_expiry_timestamp gauge
citadel_server_cert_chain_expiry_timestamp 2000
# HELP citadel_server_root_cert_expiry_timestamp The unix timestamp, in seconds, when the root certificate will expire (istiod-compatible).
# TYPE citadel_server_root_cert_expiry_timestamp gauge
citadel_server_root_cert_expiry_timestamp 9000
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// A federated bundle refreshed 90s ago is 90s old; one never fetched has
// no age and a last success of 0.
func TestWatchFederation(t *testing.T) {
	reg := prometheus.NewRegistry()
	now := time.Unix(10_000, 0)
	metrics.WatchFederation(reg, func() time.Time { return now }, func() []metrics.FederatedBundle {
		return []metrics.FederatedBundle{
			{TrustDomain: "east.example", Roots: 2, LastSuccess: now.Add(-90 * time.Second), FetchErrors: 3},
			{TrustDomain: "west.example"},
		}
	})
	want := `# HELP workload_ca_federation_bundle_age_seconds Seconds since the bundle held of a federated trust domain was last fetched or read: it rises while its source fails (the last bundle is kept).
# TYPE workload_ca_federation_bundle_age_seconds gauge
workload_ca_federation_bundle_age_seconds{trust_domain="east.example"} 90
# HELP workload_ca_federation_bundle_last_success_timestamp_seconds When the bundle of a federated trust domain was last fetched or read (0: never).
# TYPE workload_ca_federation_bundle_last_success_timestamp_seconds gauge
workload_ca_federation_bundle_last_success_timestamp_seconds{trust_domain="east.example"} 9910
workload_ca_federation_bundle_last_success_timestamp_seconds{trust_domain="west.example"} 0
# HELP workload_ca_federation_fetch_errors_total Failed refreshes of a federated trust domain's bundle.
# TYPE workload_ca_federation_fetch_errors_total counter
workload_ca_federation_fetch_errors_total{trust_domain="east.example"} 3
workload_ca_federation_fetch_errors_total{trust_domain="west.example"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "workload_ca_federation_bundle_age_seconds",
		"workload_ca_federation_bundle_last_success_timestamp_seconds", "workload_ca_federation_fetch_errors_total"); err != nil {
		t.Fatal(err)
	}
}

func TestLeftOut(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := metrics.NewLeftOut(reg)
	all := func(string) bool { return true }
	l.Set("istio_root_configmap", all, map[string]string{"a.example": "invalid"})
	l.Set("cluster_trust_bundle", func(td string) bool { return td == "c.example" }, map[string]string{"c.example": "invalid"})
	l.Set("cluster_trust_bundle", func(td string) bool { return td == "d.example" }, nil)
	l.Set("istio_root_configmap", all, map[string]string{"b.example": "dns_not_constrained"})
	want := `
# HELP workload_ca_federation_roots_left_out 1 for a federated trust domain whose roots a destination (istio_root_configmap, cluster_trust_bundle) leaves out, by reason (invalid, over_size_budget, dns_not_constrained); no series while they are in.
# TYPE workload_ca_federation_roots_left_out gauge
workload_ca_federation_roots_left_out{destination="cluster_trust_bundle",reason="invalid",trust_domain="c.example"} 1
workload_ca_federation_roots_left_out{destination="istio_root_configmap",reason="dns_not_constrained",trust_domain="b.example"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "workload_ca_federation_roots_left_out"); err != nil {
		t.Fatal(err)
	}
}
