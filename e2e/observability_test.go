package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/internal/proc"
	"github.com/workload-ca/workload-ca/e2e/internal/promserver"
)

// Metric names and label values the CA documents (metrics/).
const (
	mRequests     = "workload_ca_certificate_requests_total"
	mReviews      = "workload_ca_tokenreview_requests_total"
	mLocal        = "workload_ca_token_local_verifications_total"
	mForged       = "workload_ca_tokens_forged_total"
	mPods         = "workload_ca_podindex_pods"
	mSynced       = "workload_ca_podindex_synced"
	mExpiry       = "workload_ca_ca_cert_expiry_timestamp_seconds"
	mLeader       = "workload_ca_leader"
	mRootCMs      = "workload_ca_root_configmap_publish_total"
	mGRPCHandled  = "grpc_server_handled_total"
	certService   = "istio.v1.auth.IstioCertificateService"
	notOnNode     = "identity-not-on-node"
	maxLabelVals  = 40 // distinct values of one label name in a whole scrape
	promQueryWait = 30 * time.Second
)

// testObservability checks what an operator sees: /metrics (through
// promtool and a real Prometheus server), /healthz and /readyz, and the
// audit records, in the log and in a file of their own. It runs alone: it
// counts exact metric increments.
func (s *suite) testObservability(t *testing.T) {
	// Under `make e2e` the Prometheus tools are required: a missing one
	// fails here rather than skipping the checks.
	prometheusBin, promtool, err := promserver.LookPath()
	if err != nil {
		t.Fatal(err)
	}

	// Two requests this test can name: an impersonation ztunnel may make,
	// and one the node policy refuses.
	before := s.scrape(t, s.ca.AdminAddr())
	issued, err := s.request(t, cahost.RequestArgs{Token: s.ztunnelA, Identity: id("demo", "web"), Impersonate: true})
	if err != nil {
		t.Fatalf("issue demo/web to ztunnel on node-a: %v", err)
	}
	_, err = s.request(t, cahost.RequestArgs{Token: s.ztunnelA, Identity: id("demo", "db"), Impersonate: true})
	if got := cahost.Code(err); got != codes.PermissionDenied {
		t.Fatalf("demo/db for ztunnel on node-a: code %s, want PermissionDenied (err: %v)", got, err)
	}
	raw := s.scrapeRaw(t, s.ca.AdminAddr())
	after := parseScrape(t, raw)

	t.Run("/metrics passes promtool check metrics", func(t *testing.T) {
		complaints, err := promserver.CheckMetrics(t.Context(), promtool, raw)
		if err != nil {
			t.Fatal(err)
		}
		if len(complaints) > 0 {
			t.Errorf("promtool check metrics:\n%s", strings.Join(complaints, "\n"))
		}
	})
	t.Run("/metrics holds the CA's metrics with the values its state implies", func(t *testing.T) {
		s.checkMetricValues(t, before, after)
	})
	t.Run("no label value names a workload: no SPIFFE ID, pod, caller or serial", func(t *testing.T) {
		s.checkLabelCardinality(t, after, issued)
	})
	t.Run("/healthz and /readyz answer 200", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/readyz"} {
			code, body := httpGet(t, "http://"+s.ca.AdminAddr()+path)
			if code != http.StatusOK {
				t.Errorf("%s: %d %q", path, code, body)
			}
		}
	})
	t.Run("a Prometheus server scrapes the CA and answers queries", func(t *testing.T) {
		want, _ := after.Sum(mRequests, "result", "issued")
		s.checkPrometheusServer(t, prometheusBin, want)
	})
	t.Run("audit records in the log: marked, one per decision, with its fields", func(t *testing.T) {
		s.checkAuditInLog(t, issued)
	})
	t.Run("--audit-log sends audit records to their own file; --istio-metrics-compat", func(t *testing.T) {
		s.checkAuditLogFile(t, promtool)
	})
}

// checkMetricValues compares the scrapes before and after this test's two
// requests: the increments are exact, nothing else ran meanwhile.
func (s *suite) checkMetricValues(t *testing.T, before, after promserver.Samples) {
	delta := func(name string, labels ...string) float64 {
		a, n := after.Sum(name, labels...)
		if n == 0 {
			t.Errorf("no %s%v in the scrape", name, labels)
		}
		b, _ := before.Sum(name, labels...)
		return a - b
	}
	positive := func(name string, labels ...string) float64 {
		v, n := after.Sum(name, labels...)
		if n == 0 || v <= 0 {
			t.Errorf("%s%v = %v over %d series, want > 0", name, labels, v, n)
		}
		return v
	}
	positive(mRequests, "result", "issued")
	positive(mRequests, "result", "denied", "reason", notOnNode)
	if d := delta(mRequests, "result", "issued"); d != 1 {
		t.Errorf("%s{result=issued} rose by %v for one issued certificate", mRequests, d)
	}
	if d := delta(mRequests, "result", "denied", "reason", notOnNode); d != 1 {
		t.Errorf("%s{result=denied,reason=%s} rose by %v for one such denial", mRequests, notOnNode, d)
	}
	if d := delta(mRequests); d != 2 {
		t.Errorf("%s rose by %v in all for 2 requests", mRequests, d)
	}
	// The suite's ztunnel tokens are pod-bound: verified locally. The
	// TokenReview series are exported all the same, for the dashboard.
	positive(mLocal, "verdict", "accepted")
	if _, n := after.Sum(mReviews, "result", "authenticated"); n != 1 {
		t.Errorf("%s{result=authenticated}: %d series, want 1 exported", mReviews, n)
	}
	positive(mPods)
	if v, n := after.Sum(mSynced); n != 1 || v != 1 {
		t.Errorf("%s = %v (%d series), want 1", mSynced, v, n)
	}
	positive(mGRPCHandled, "grpc_service", certService, "grpc_method", "CreateCertificate", "grpc_code", "OK")
	positive(mGRPCHandled, "grpc_service", certService, "grpc_method", "CreateCertificate", "grpc_code", "PermissionDenied")
	for _, code := range []string{"OK", "PermissionDenied"} {
		if d := delta(mGRPCHandled, "grpc_method", "CreateCertificate", "grpc_code", code); d != 1 {
			t.Errorf("%s{CreateCertificate,%s} rose by %v, want 1", mGRPCHandled, code, d)
		}
	}

	// The root's expiry is the root certificate's NotAfter, in the future.
	root := after.Match(mExpiry, "kind", "root")
	if len(root) != 1 {
		t.Fatalf("%s{kind=root}: %d series, want 1", mExpiry, len(root))
	}
	if wantExp := latestNotAfter(t, s.ca.RootCertPath()); root[0].Value != float64(wantExp.Unix()) {
		t.Errorf("%s{kind=root} = %v, want the root's NotAfter %d (%v)", mExpiry, root[0].Value, wantExp.Unix(), wantExp)
	}
	if exp := time.Unix(int64(root[0].Value), 0); !exp.After(time.Now()) {
		t.Errorf("root expiry %v is not in the future", exp)
	}
	if sig := after.Match(mExpiry, "kind", "signing"); len(sig) != 1 || sig[0].Value <= float64(time.Now().Unix()) {
		t.Errorf("%s{kind=signing}: %+v, want one in the future", mExpiry, sig)
	}

	// The only replica takes the lease within a lease duration of start;
	// the suite has long run past that, but poll rather than assume.
	leader := after
	err := pollUntil(t, 20*time.Second, func() (bool, error) {
		v, n := leader.Sum(mLeader)
		if n == 1 && v == 1 {
			return true, nil
		}
		leader = s.scrape(t, s.ca.AdminAddr())
		return false, nil
	})
	if err != nil {
		v, n := leader.Sum(mLeader)
		t.Errorf("%s = %v (%d series), want 1: %v", mLeader, v, n, err)
	}
}

// checkLabelCardinality fails on label values that name a workload (their
// number grows with the cluster) and on labels with many values.
func (s *suite) checkLabelCardinality(t *testing.T, samples promserver.Samples, issued cahost.Result) {
	forbidden := map[string]string{} // value → what it is
	for key, pod := range s.pods {
		forbidden[pod.Name] = "fixture pod " + key
	}
	pods, err := s.cp.Client().CoreV1().Pods(metav1.NamespaceAll).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		forbidden[p.Name] = "pod " + p.Namespace + "/" + p.Name
	}
	for _, r := range auditRecords(s.ca.Logs()) { // every decision the suite caused
		for what, v := range map[string]string{"pod": r.Pod, "caller": r.Caller, "serial": r.Serial} {
			if len(v) > 2 { // "/" is the caller of an unauthenticated request
				forbidden[v] = "audited " + what
			}
		}
	}
	forbidden[issued.Serial] = "serial of an issued certificate"

	values := map[string]map[string]bool{} // label name → values
	for _, smp := range samples {
		for name, v := range smp.Labels {
			if values[name] == nil {
				values[name] = map[string]bool{}
			}
			values[name][v] = true
			if strings.Contains(v, "spiffe://") {
				t.Errorf("%s{%s=%q}: a SPIFFE ID as a label value", smp.Name, name, v)
			}
			for bad, what := range forbidden {
				if strings.Contains(v, bad) {
					t.Errorf("%s{%s=%q}: holds %q (%s)", smp.Name, name, v, bad, what)
				}
			}
		}
	}
	for name, vs := range values {
		if len(vs) > maxLabelVals {
			t.Errorf("label %s has %d values in one scrape (> %d): %v", name, len(vs), maxLabelVals, slices.Sorted(maps.Keys(vs)))
		}
	}
	t.Logf("%d series, %d label names, %d forbidden values checked", len(samples), len(values), len(forbidden))
}

// checkPrometheusServer scrapes the CA with a real Prometheus server and
// waits until a query returns the issued count the CA shows.
func (s *suite) checkPrometheusServer(t *testing.T, bin string, wantIssued float64) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	began := time.Now()
	srv, err := promserver.Start(ctx, promserver.Options{Binary: bin, WorkDir: filepath.Join(s.workDir, s.runName("prometheus")),
		Job: "workload-ca", Targets: []string{s.ca.AdminAddr()}, ScrapeInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = srv.Stop()
		}
	}()
	ready := time.Since(began)

	query := fmt.Sprintf(`%s{job="workload-ca",result="issued"}`, mRequests)
	var got []promserver.Result
	err = pollUntil(t, promQueryWait, func() (bool, error) {
		var qerr error
		got, qerr = srv.Query(ctx, query)
		return qerr == nil && len(got) == 1 && got[0].Value >= 1 && got[0].Value == wantIssued, nil
	})
	if err != nil {
		targets, _ := srv.Targets(ctx)
		t.Fatalf("%s: %+v after %v, want %v: %v\ntargets: %+v\nprometheus output:\n%s",
			query, got, promQueryWait, wantIssued, err, targets, lastLines(srv.Tail(), 20))
	}
	t.Logf("prometheus ready in %v; %s = %v after %v", ready.Round(time.Millisecond), query, got[0].Value,
		time.Since(began).Round(time.Millisecond))
	if up, err := srv.Query(ctx, `up{job="workload-ca"}`); err != nil || len(up) != 1 || up[0].Value != 1 {
		t.Errorf("up{job=workload-ca}: %+v, %v", up, err)
	}
	if v, err := srv.Query(ctx, mLeader); err != nil || len(v) != 1 || v[0].Value != 1 {
		t.Errorf("%s through Prometheus: %+v, %v", mLeader, v, err)
	}

	pid := srv.Pid()
	stopped = true
	if err := srv.Stop(); err != nil {
		t.Errorf("stop prometheus: %v", err)
	}
	if !proc.Gone(pid) {
		t.Errorf("prometheus (pid %d) still running after Stop", pid)
	}
}

// checkAuditInLog finds this test's two decisions among the suite CA's
// audit records, marked "log":"audit" in its log.
func (s *suite) checkAuditInLog(t *testing.T, issued cahost.Result) {
	logs := s.ca.Logs()
	records := auditRecords(logs)
	if len(records) == 0 {
		t.Fatalf("no \"log\":\"audit\" record in %s", s.ca.LogPath())
	}
	var gotIssued, gotDenied bool
	for _, r := range records {
		switch {
		case r.Decision == "issued" && r.Serial == issued.Serial:
			gotIssued = true
			want := auditRecord{Log: "audit", Decision: "issued", Caller: "istio-system/ztunnel", Pod: "ztunnel-a",
				Node: "node-a", Requested: id("demo", "web"), Identity: id("demo", "web"), Serial: issued.Serial}
			if got := r.withoutTimes(); got != want {
				t.Errorf("issued record\n got %+v\nwant %+v", got, want)
			}
			if !r.NotAfter.Equal(issued.NotAfter) {
				t.Errorf("issued record: not_after %v, certificate's %v", r.NotAfter, issued.NotAfter)
			}
		case r.Decision == "denied" && r.Reason == notOnNode && r.Requested == id("demo", "db") && r.Pod == "ztunnel-a":
			gotDenied = true
			if r.Caller != "istio-system/ztunnel" || r.Node != "node-a" || r.Code != codes.PermissionDenied.String() ||
				r.Error == "" || r.Identity != "" || r.Serial != "" {
				t.Errorf("denied record %+v", r)
			}
		}
	}
	if !gotIssued {
		t.Errorf("no audit record of the issued certificate %s (serial %s) among %d", issued.SPIFFEID, issued.Serial, len(records))
	}
	if !gotDenied {
		t.Errorf("no audit record of ztunnel-a denied demo/db for %s among %d", notOnNode, len(records))
	}
	// Every decision is marked as an audit record: none goes unmarked.
	if n := strings.Count(logs, `"decision":`); n != len(records) {
		t.Errorf("%d lines carry a decision, %d of them marked \"log\":\"audit\"", n, len(records))
	}
	decisions := map[string]int{}
	for _, r := range records {
		decisions[r.Decision]++
	}
	t.Logf("%d audit records in the log: %v", len(records), decisions)
}

// checkAuditLogFile starts a second CA with --audit-log (it competes for
// the same lease and stays a follower) and --istio-metrics-compat.
func (s *suite) checkAuditLogFile(t *testing.T, promtool string) {
	workDir := filepath.Join(s.workDir, s.runName("ca-audit-log"))
	auditPath := filepath.Join(workDir, "audit.log")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ca, err := cahost.Start(ctx, cahost.Options{Kubeconfig: s.cp.KubeconfigPath(), WorkDir: workDir,
		ExtraArgs: []string{"--audit-log", auditPath, "--istio-metrics-compat"}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = ca.Stop()
		}
	}()
	issued, err := ca.Request(ctx, cahost.RequestArgs{Token: s.ztunnelB, Identity: id("demo", "db"), Impersonate: true})
	if err != nil {
		t.Fatalf("second CA: issue demo/db to ztunnel on node-b: %v", err)
	}
	_, err = ca.Request(ctx, cahost.RequestArgs{Token: s.ztunnelB, Identity: id("demo", "web"), Impersonate: true})
	if got := cahost.Code(err); got != codes.PermissionDenied {
		t.Fatalf("second CA: demo/web for ztunnel on node-b: code %s, want PermissionDenied (err: %v)", got, err)
	}

	t.Run("istio-compatible counters, and what promtool says of them", func(t *testing.T) {
		raw := s.scrapeRaw(t, ca.AdminAddr())
		samples := parseScrape(t, raw)
		for name, want := range map[string]float64{"citadel_server_csr_count": 2,
			"citadel_server_success_cert_issuance_count": 1, "citadel_server_authentication_failure_count": 1} {
			if v, n := samples.Sum(name); n != 1 || v != want {
				t.Errorf("%s = %v (%d series), want %v", name, v, n, want)
			}
		}
		if v, _ := samples.Sum(mLeader); v != 0 {
			t.Errorf("the second replica reports %s %v while the suite's CA leads", mLeader, v)
		}
		complaints, err := promserver.CheckMetrics(t.Context(), promtool, raw)
		if err != nil {
			t.Fatal(err)
		}
		// istiod's names end in _count and lack _total; keeping them is the
		// point of the flag. Anything else promtool says is a defect.
		for _, c := range complaints {
			if !strings.HasPrefix(c, "citadel_server_") {
				t.Errorf("promtool check metrics: %s", c)
			}
		}
		t.Logf("promtool on the istio-compatible names (expected, istiod's names):\n%s", strings.Join(complaints, "\n"))
	})

	stopped = true
	if err := ca.Stop(); err != nil { // flushes and closes the audit file
		t.Fatalf("stop the second CA: %v", err)
	}
	b, err := os.ReadFile(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	audit := string(b)
	records := auditRecords(audit)
	var decisions []string
	for _, r := range records {
		decisions = append(decisions, r.Decision)
		switch r.Decision {
		case "issued":
			if r.Serial != issued.Serial || r.Identity != id("demo", "db") || r.Pod != "ztunnel-b" || r.Node != "node-b" ||
				r.Caller != "istio-system/ztunnel" || !r.NotAfter.Equal(issued.NotAfter) {
				t.Errorf("issued record %+v; certificate serial %s not_after %v", r, issued.Serial, issued.NotAfter)
			}
		case "denied":
			if r.Reason != notOnNode || r.Requested != id("demo", "web") || r.Pod != "ztunnel-b" || r.Code != codes.PermissionDenied.String() {
				t.Errorf("denied record %+v", r)
			}
		}
	}
	if !slices.Equal(decisions, []string{"issued", "denied"}) {
		t.Errorf("audit file %s: decisions %v, want [issued denied]:\n%s", auditPath, decisions, audit)
	}
	if n := strings.Count(strings.TrimSpace(audit), "\n") + 1; n != len(records) {
		t.Errorf("audit file: %d lines, %d audit records", n, len(records))
	}

	logs := ca.Logs()
	if !strings.Contains(logs, `"msg":"serving"`) {
		t.Errorf("the second CA's log lacks its start-up lines:\n%s", lastLines(logs, 10))
	}
	for _, marker := range []string{`"log":"audit"`, `"decision":`, issued.Serial} {
		if strings.Contains(logs, marker) {
			t.Errorf("with --audit-log, the log %s still holds %s", ca.LogPath(), marker)
		}
	}
	s.checkNoToken(t, map[string]string{ca.LogPath(): logs, auditPath: audit})
}

// checkNoToken looks for every token the suite handed out, whole or in
// part, in each text (by file name), and returns how many tokens it
// checked. The suite's own CA log is checked after the CA stops
// (testLogsHoldNoToken).
func (s *suite) checkNoToken(t *testing.T, texts map[string]string) int {
	t.Helper()
	s.mu.Lock()
	tokens := append([]string(nil), s.tokens...)
	s.mu.Unlock()
	for file, text := range texts {
		for i, tok := range tokens {
			for _, secret := range secretParts(tok) {
				if strings.Contains(text, secret) {
					t.Errorf("token %d (%s…) appears in %s", i, secret[:min(12, len(secret))], file)
					break
				}
			}
		}
	}
	return len(tokens)
}

// auditRecord is one audit record as the CA writes it (server.record).
type auditRecord struct {
	Log       string    `json:"log"`
	Decision  string    `json:"decision"`
	Caller    string    `json:"caller"`
	Pod       string    `json:"pod"`
	Node      string    `json:"node"`
	Requested string    `json:"requested"`
	Identity  string    `json:"identity"`
	Serial    string    `json:"serial"`
	NotAfter  time.Time `json:"not_after"`
	Reason    string    `json:"reason"`
	Code      string    `json:"code"`
	Error     string    `json:"error"`
}

func (r auditRecord) withoutTimes() auditRecord {
	r.NotAfter = time.Time{}
	return r
}

// auditRecords returns the JSON lines of text marked "log":"audit".
func auditRecords(text string) []auditRecord {
	var out []auditRecord
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var r auditRecord
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Log == "audit" {
			out = append(out, r)
		}
	}
	return out
}

// scrapeRaw GETs http://addr/metrics in the text format.
func (s *suite) scrapeRaw(t *testing.T, addr string) []byte {
	t.Helper()
	code, body := httpGet(t, "http://"+addr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %q", code, body)
	}
	return body
}

func (s *suite) scrape(t *testing.T, addr string) promserver.Samples {
	t.Helper()
	return parseScrape(t, s.scrapeRaw(t, addr))
}

func parseScrape(t *testing.T, raw []byte) promserver.Samples {
	t.Helper()
	samples, err := promserver.ParseText(raw)
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return samples
}

func httpGet(t *testing.T, url string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, body
}

// latestNotAfter returns the latest NotAfter among the PEM certificates of
// file.
func latestNotAfter(t *testing.T, file string) time.Time {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := pemCerts(b)
	if err != nil {
		t.Fatal(err)
	}
	var latest time.Time
	for _, c := range certs {
		if c.NotAfter.After(latest) {
			latest = c.NotAfter
		}
	}
	if latest.IsZero() {
		t.Fatalf("%s: no certificate", file)
	}
	return latest
}
