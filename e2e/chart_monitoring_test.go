package e2e_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The chart's optional monitoring objects (PrometheusRule, dashboard),
// checked with promtool; TestChart calls checkMonitoring.

// metricNames returns the workload_ca_* series names an object refers to.
func metricNames(o *unstructured.Unstructured) []string {
	b, _ := json.Marshal(o.Object)
	names := regexp.MustCompile(`workload_ca_[a-z0-9_]+`).FindAllString(string(b), -1)
	slices.Sort(names)
	return slices.Compact(names)
}

// checkMonitoring checks the optional monitoring objects (PrometheusRule,
// dashboard) that full-values.yaml turns on.
func checkMonitoring(t *testing.T, objs []*unstructured.Unstructured) {
	promtool := promtoolPath(t)
	checkAlerts(t, promtool, objs)
	checkDashboard(t, promtool, objs)
}

// promtoolPath finds promtool, failing t without it.
func promtoolPath(t *testing.T) string {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("%v: install Debian's prometheus package (`make prometheus-tools`)", err)
	}
	return promtool
}

// alertRules returns the rendered PrometheusRule's spec and each alert's
// annotations, by alert name.
func alertRules(t *testing.T, objs []*unstructured.Unstructured) (spec map[string]any, annotations map[string]map[string]string) {
	t.Helper()
	spec, _, _ = unstructured.NestedMap(findObject(t, objs, "PrometheusRule").Object, "spec")
	annotations = map[string]map[string]string{}
	groups, _, _ := unstructured.NestedSlice(spec, "groups")
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			if name, _, _ := unstructured.NestedString(r.(map[string]any), "alert"); name != "" {
				annotations[name], _, _ = unstructured.NestedStringMap(r.(map[string]any), "annotations")
			}
		}
	}
	return spec, annotations
}

// promtoolTest has promtool check the rules of spec and run tests (promtool
// rule test groups) against them.
func promtoolTest(t *testing.T, promtool string, spec map[string]any, tests any) {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, v any) {
		b, err := json.Marshal(v) // JSON is YAML
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("rules.yaml", spec)
	write("test.yaml", map[string]any{"rule_files": []string{"rules.yaml"}, "evaluation_interval": "1m", "tests": tests})
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "test.yaml"}} {
		cmd := exec.CommandContext(t.Context(), promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// checkDashboard parses the dashboard JSON and has promtool parse every
// query, with the dashboard's variables filled in.
func checkDashboard(t *testing.T, promtool string, objs []*unstructured.Unstructured) {
	raw := configMapData(t, objs, "-dashboard", "workload-ca.json")
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(raw), &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	fill := strings.NewReplacer("$__rate_interval", "5m", "$job", "wca-full", "$namespace", "wca-chart-full")
	var rules []map[string]string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:query_%d", len(rules)), "expr": fill.Replace(tg.Expr)})
		}
	}
	if len(dash.Panels) < 6 {
		t.Errorf("the dashboard has %d panels, want at least 6", len(dash.Panels))
	}
	file := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	b, _ := json.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(t.Context(), promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules (the dashboard's queries): %v\n%s", err, out)
	}
}

// checkAlerts unit-tests the rendered PrometheusRule with promtool: the
// rules load, fire on the trouble they name with the labels and
// annotations an operator gets, and stay silent on a healthy CA.
func checkAlerts(t *testing.T, promtool string, objs []*unstructured.Unstructured) {
	spec, annotations := alertRules(t, objs)
	// The annotations an alert should carry: the rendered ones with their
	// Prometheus templates filled in as Prometheus would.
	expect := func(alert string, subst ...string) map[string]string {
		out := map[string]string{}
		for k, v := range annotations[alert] {
			out[k] = strings.NewReplacer(subst...).Replace(v)
		}
		return out
	}
	const job, ns = "wca-full", "wca-chart-full"
	series := func(name, labels, values string) map[string]string {
		l := `job="` + job + `",namespace="` + ns + `"`
		if labels != "" {
			l += "," + labels
		}
		return map[string]string{"series": name + "{" + l + "}", "values": values}
	}
	const (
		expiry   = "workload_ca_ca_cert_expiry_timestamp_seconds"
		leader   = "workload_ca_leader"
		requests = "workload_ca_certificate_requests_total"
		synced   = "workload_ca_podindex_synced"
		rootCMs  = "workload_ca_root_configmap_publish_total"
		reviews  = "workload_ca_tokenreview_requests_total"
		latency  = "workload_ca_issuance_duration_seconds_bucket"
		serving  = "workload_ca_serving_cert_expiry_timestamp_seconds"
		istiod   = "workload_ca_istiod_cert_expiry_timestamp_seconds"
		nextStep = "workload_ca_rotation_next_step_timestamp_seconds"
		fedAge   = "workload_ca_federation_bundle_age_seconds"
		fedLast  = "workload_ca_federation_bundle_last_success_timestamp_seconds"
		policies = "workload_ca_policy_decisions_total"
		year     = "31536000x180"
	)
	type alert struct {
		Labels      map[string]string `json:"exp_labels"`
		Annotations map[string]string `json:"exp_annotations"`
	}
	type alertTest struct {
		EvalTime  string  `json:"eval_time"`
		AlertName string  `json:"alertname"`
		Alerts    []alert `json:"exp_alerts"`
	}
	type group struct {
		Interval string              `json:"interval"`
		Series   []map[string]string `json:"input_series"`
		Alerts   []alertTest         `json:"alert_rule_test"`
	}
	at := func(name string, alerts ...alert) alertTest {
		return alertTest{EvalTime: "2h", AlertName: name, Alerts: append([]alert{}, alerts...)}
	}
	nsLabels := func(kv ...string) map[string]string {
		m := map[string]string{"namespace": ns}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	trouble := group{Interval: "1m", Series: []map[string]string{
		series(expiry, `pod="p0",kind="root"`, "1728000x180"), // 20 days after t=0
		series(expiry, `pod="p0",kind="signing"`, year),
		series(leader, `pod="p0"`, "0x180"),
		series(leader, `pod="p1"`, "0x180"),
		series(requests, `pod="p0",result="issued",reason=""`, "0+60x180"),                     // 1/s
		series(requests, `pod="p0",result="denied",reason="identity-not-on-node"`, "0+60x180"), // 1/s
		series("up", `pod="p0"`, "1x180"),
		series("up", `pod="p1"`, "0x180"),
		series(synced, `pod="p0"`, "1x180"),
		series(synced, `pod="p1"`, "0x180"),
		series(rootCMs, `pod="p0",result="repaired"`, "0+1x180"), // istiod fights over them
		series(rootCMs, `pod="p0",result="unchanged"`, "0+100x180"),
		series(nextStep, `pod="p0",step="activate"`, "0x180"), // due at t=0, never taken
		series(nextStep, `pod="p1",step="activate"`, "0x180"),
		series(fedAge, `pod="p0",trust_domain="east.example.org"`, "0+60x180"), // never refreshed since t=0
		series(fedLast, `pod="p0",trust_domain="east.example.org"`, "1x180"),
		series(policies, `pod="p0",policy="tenants",decision="unavailable"`, "0+1x180"), // 1 a minute, a broken policy
		series(policies, `pod="p0",policy="payments",decision="denied"`, "0+1x180"),
	}, Alerts: []alertTest{
		at("WorkloadCAIssuancePolicyCannotDecide", alert{nsLabels("severity", "warning", "policy", "tenants"),
			expect("WorkloadCAIssuancePolicyCannotDecide", "{{ $labels.policy }}", "tenants", "{{ $value | humanize }}", "10")}),
		at("WorkloadCAFederatedBundleStale", alert{nsLabels("severity", "warning", "trust_domain", "east.example.org"),
			expect("WorkloadCAFederatedBundleStale", "{{ $labels.trust_domain }}", "east.example.org")}),
		at("WorkloadCARotationStuck", alert{nsLabels("severity", "warning", "step", "activate"),
			expect("WorkloadCARotationStuck", "{{ $labels.step }}", "activate", "{{ $value | humanizeDuration }}", "2h 0m 0s")}),
		at("WorkloadCARootExpiringSoon", alert{nsLabels("severity", "warning"),
			expect("WorkloadCARootExpiringSoon", "{{ $value | humanizeDuration }}", "19d 22h 0m 0s")}),
		at("WorkloadCAIntermediateExpiringSoon"),
		at("WorkloadCACertificateExpiryCritical"),
		at("WorkloadCANoLeader", alert{nsLabels("severity", "warning"), expect("WorkloadCANoLeader")}),
		at("WorkloadCADenialSpike", alert{nsLabels("severity", "warning"),
			expect("WorkloadCADenialSpike", "{{ $value | humanizePercentage }}", "50%")}),
		at("WorkloadCAReplicaDown", alert{nsLabels("severity", "warning", "job", job, "pod", "p1"), expect("WorkloadCAReplicaDown")}),
		at("WorkloadCARootsContested", alert{nsLabels("severity", "warning"),
			expect("WorkloadCARootsContested", "{{ $value | humanize }}", "30")}),
		at("WorkloadCADown"),
		at("WorkloadCANotReady", alert{nsLabels("severity", "warning", "job", job, "pod", "p1"), expect("WorkloadCANotReady")}),
	}}
	healthy := group{Interval: "1m", Series: []map[string]string{
		series(expiry, `pod="p0",kind="root"`, year),
		series(expiry, `pod="p0",kind="intermediate"`, year),
		series(expiry, `pod="p0",kind="signing"`, year),
		series(leader, `pod="p0"`, "1x180"),
		series(leader, `pod="p1"`, "0x180"),
		series(requests, `pod="p0",result="issued",reason=""`, "0+60x180"),
		series(requests, `pod="p0",result="denied",reason="identity-not-on-node"`, "0+0.6x180"), // 1%
		series("up", `pod="p0"`, "1x180"),
		series("up", `pod="p1"`, "1x180"),
		series(synced, `pod="p0"`, "1x180"),
		series(synced, `pod="p1"`, "1x180"),
		series(reviews, `pod="p0",result="authenticated"`, "0+60x180"),
		series(latency, `pod="p0",result="issued",le="0.05"`, "0+60x180"),
		series(latency, `pod="p0",result="issued",le="+Inf"`, "0+60x180"),
		series(serving, `pod="p0"`, year),
		series(istiod, `pod="p0"`, year),
		series(istiod, `pod="p1"`, "0x180"), // never led
		series(nextStep, `pod="p0",step="prepare"`, year),
		series(nextStep, `pod="p1",step="prepare"`, year),
		series(fedAge, `pod="p0",trust_domain="east.example.org"`, "60x180"),
		series(fedLast, `pod="p0",trust_domain="east.example.org"`, "1x180"),
		series(policies, `pod="p0",policy="payments",decision="denied"`, "0+1x180"),
		series(policies, `pod="p0",policy="payments",decision="ttl-capped"`, "0+60x180"),
	}}
	for name := range annotations {
		healthy.Alerts = append(healthy.Alerts, at(name))
	}
	slices.SortFunc(healthy.Alerts, func(a, b alertTest) int { return strings.Compare(a.AlertName, b.AlertName) })
	dire := group{Interval: "1m", Series: []map[string]string{
		series(expiry, `pod="p0",kind="intermediate"`, "432000x180"), // 5 days
		series("up", `pod="p0"`, "0x180"),
		series("up", `pod="p1"`, "0x180"),
		series(requests, `pod="p0",result="issued",reason=""`, "0+60x180"),
		series(requests, `pod="p0",result="internal",reason=""`, "0+60x180"), // half fail
		series(reviews, `pod="p0",result="authenticated"`, "0+6x180"),
		series(reviews, `pod="p0",result="error"`, "0+6x180"),
		series(latency, `pod="p0",result="issued",le="0.5"`, "0x180"),
		series(latency, `pod="p0",result="issued",le="2.5"`, "0x180"),
		series(latency, `pod="p0",result="issued",le="+Inf"`, "0+60x180"), // every answer over 2.5s
		series(serving, `pod="p0"`, "10800x180"),                          // 1h left at 2h
		series(istiod, `pod="p0"`, "10800x180"),
	}, Alerts: []alertTest{
		at("WorkloadCAErrorRatio", alert{nsLabels("severity", "warning"),
			expect("WorkloadCAErrorRatio", "{{ $value | humanizePercentage }}", "50%")}),
		at("WorkloadCATokenReviewErrors", alert{nsLabels("severity", "warning"),
			expect("WorkloadCATokenReviewErrors", "{{ $value | humanizePercentage }}", "50%")}),
		at("WorkloadCAHighLatency", alert{nsLabels("severity", "warning"),
			expect("WorkloadCAHighLatency", "{{ $value | humanizeDuration }}", "2.5s")}),
		at("WorkloadCAServingCertificateExpiring", alert{nsLabels("severity", "critical", "pod", "p0"),
			expect("WorkloadCAServingCertificateExpiring", "{{ $labels.pod }}", "p0", "{{ $value | humanizeDuration }}", "1h 0m 0s")}),
		at("WorkloadCAIstiodCertificateExpiring", alert{nsLabels("severity", "critical"),
			expect("WorkloadCAIstiodCertificateExpiring", "{{ $value | humanizeDuration }}", "1h 0m 0s")}),
		at("WorkloadCACertificateExpiryCritical", alert{nsLabels("severity", "critical", "kind", "intermediate"),
			expect("WorkloadCACertificateExpiryCritical", "{{ $labels.kind }}", "intermediate")}),
		at("WorkloadCAIntermediateExpiringSoon", alert{nsLabels("severity", "warning", "kind", "intermediate"),
			expect("WorkloadCAIntermediateExpiringSoon", "{{ $labels.kind }}", "intermediate",
				"{{ $value | humanizeDuration }}", "4d 22h 0m 0s")}),
		at("WorkloadCADown", alert{nsLabels("severity", "critical", "job", job), expect("WorkloadCADown")}),
	}}
	if len(annotations) < 15 {
		t.Fatalf("the PrometheusRule has %d alerts, want at least 15", len(annotations))
	}
	checkRunbooks(t, annotations)
	promtoolTest(t, promtool, spec, []group{trouble, healthy, dire})
}

// checkUpstreamAlert unit-tests, with promtool, the alert that only an
// upstream CA brings (ci/upstream-values.yaml): it fires once the
// successor has been overdue for upstreamSuccessorMinutes, with the time
// left, and is silent without the series.
func checkUpstreamAlert(t *testing.T, objs []*unstructured.Unstructured) {
	const name = "WorkloadCAUpstreamSuccessorMissing"
	spec, all := alertRules(t, objs)
	if len(all[name]) == 0 {
		t.Fatalf("no %s alert rendered", name)
	}
	annotations := map[string]string{}
	for k, v := range all[name] {
		annotations[k] = strings.ReplaceAll(v, "{{ $value | humanizeDuration }}", "1h 0m 0s")
	}
	selector := `namespace="wca-chart-upstream",job="wca-workload-ca",pod="p0"`
	group := func(values string, fires bool) map[string]any {
		var alerts []any
		if fires {
			alerts = []any{map[string]any{"exp_labels": map[string]string{"namespace": "wca-chart-upstream", "severity": "warning"},
				"exp_annotations": annotations}}
		}
		return map[string]any{"interval": "1m",
			"input_series":    []any{map[string]string{"series": "workload_ca_upstream_expiry_without_successor_seconds{" + selector + "}", "values": values}},
			"alert_rule_test": []any{map[string]any{"eval_time": "2h", "alertname": name, "exp_alerts": alerts}}}
	}
	promtoolTest(t, promtoolPath(t), spec, []any{group("3600x180", true), group("_x180", false)})
}

// checkRunbooks: every alert's runbook_url points at its own section of
// docs/operations.md, which exists.
func checkRunbooks(t *testing.T, annotations map[string]map[string]string) {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name, a := range annotations {
		url := a["runbook_url"]
		if !strings.HasSuffix(url, "/docs/operations.md#"+strings.ToLower(name)) {
			t.Errorf("alert %s: runbook_url %q does not point at its section of docs/operations.md", name, url)
		}
		if !strings.Contains(string(doc), "\n### "+name+"\n") {
			t.Errorf("alert %s: docs/operations.md has no runbook section \"### %s\"", name, name)
		}
	}
}
