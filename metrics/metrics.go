package metrics

import (
	"regexp"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/workload-ca/workload-ca/issuance"
)

const namespace = "workload_ca"

// latencyBuckets span a cached request (~0.2 ms) to a slow API call (~5 s).
var latencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

// Metrics holds the CA's metrics.
type Metrics struct {
	requests     *prometheus.CounterVec
	issuance     *prometheus.HistogramVec
	reviews      *prometheus.CounterVec
	reviewTime   prometheus.Histogram
	forged       prometheus.Counter
	local        *prometheus.CounterVec
	cacheLookups *prometheus.CounterVec
	published    *prometheus.CounterVec
	podCerts     *prometheus.CounterVec
	policies     *prometheus.CounterVec
	// mu guards policyNames, the policies whose counters are exported.
	mu           sync.Mutex
	policyNames  map[string]bool
	rootCMs      *prometheus.CounterVec
	istiodCerts  *prometheus.CounterVec
	istiodExpiry prometheus.Gauge
	rotations    *prometheus.CounterVec
	leader       prometheus.Gauge
	istio        *istioCompat
	// clusterRequests and remoteReady are per cluster, bounded by the
	// configured clusters.
	clusterRequests *prometheus.CounterVec
	remoteReady     *prometheus.GaugeVec
	// remoteRefused is by reason, a fixed set.
	remoteRefused *prometheus.CounterVec

	// The series every issued certificate updates, resolved once: looking
	// a child up by its label values hashes them on every request.
	issued, cacheHit, cacheMiss prometheus.Counter
	issuedTime                  prometheus.Observer
}

// Options selects optional metrics.
type Options struct {
	// IstioCompat also exports istiod's citadel_server_* names, so existing
	// Istio dashboards and alerts keep working.
	IstioCompat bool
	// Build names the running build in workload_ca_build_info.
	Build BuildInfo
}

// BuildInfo is what workload_ca_build_info carries as labels.
type BuildInfo struct {
	Version, Revision, GoVersion string
}

// runtimeMetrics matches the Go runtime metrics exported beyond the
// collector's defaults, the two that explain a slow answer on a CA that is
// not overloaded: the CPU the garbage collector takes (its cycles come
// with the default go_gc_duration_seconds) as
// go_cpu_classes_gc_total_cpu_seconds_total, and how long goroutines wait
// to run once runnable, as the histogram go_sched_latencies_seconds.
const runtimeMetrics = `^(/cpu/classes/gc/total:cpu-seconds|/sched/latencies:seconds)$`

// New registers the CA's metrics, the Go runtime and process collectors on
// reg.
func New(reg prometheus.Registerer, opts Options) *Metrics {
	f := factory{reg}
	m := &Metrics{
		requests: f.counterVec("certificate_requests_total",
			"Certificate requests by front door (grpc, podcert), result (issued, unauthenticated, denied, invalid, unavailable, canceled, internal) and denial reason.", "door", "result", "reason"),
		issuance: f.histogramVec("issuance_duration_seconds",
			"Time to answer a certificate request, by front door and result.", "door", "result"),
		reviews: f.counterVec("tokenreview_requests_total",
			"TokenReview API calls by result.", "result"),
		reviewTime: f.histogram("tokenreview_duration_seconds", "Latency of TokenReview API calls."),
		forged: f.counter("tokens_forged_total",
			"Tokens refused without a TokenReview: their signature verifies with no key of the service account issuer."),
		local: f.counterVec("token_local_verifications_total",
			"New tokens with a verified signature judged without a TokenReview, by verdict (accepted, rejected, undecided: sent to a TokenReview).", "verdict"),
		cacheLookups: f.counterVec("tokenreview_cache_lookups_total",
			"Token review cache lookups by result (hit, miss).", "result"),
		published: f.counterVec("trustbundle_publish_total",
			"ClusterTrustBundle reconciliations by result (created, updated, repaired, deferred, unchanged, error).", "result"),
		podCerts: f.counterVec("pod_certificate_requests_total",
			"PodCertificateRequests decided, by result (issued, denied, failed).", "result"),
		policies: f.counterVec("policy_decisions_total",
			"Decisions of issuance policies, by policy and decision (denied, would-deny: in dry-run mode, unavailable: the policy does not compile or an input is unknown, ttl-capped).", "policy", "decision"),
		rootCMs: f.counterVec("root_configmap_publish_total",
			"Reconciliations of Istio's istio-ca-root-cert ConfigMap, one per namespace, by result (created, updated, repaired, deferred, unchanged, skipped, requeued, error).", "result"),
		istiodCerts: f.counterVec("istiod_cert_publish_total",
			"Reconciliations of istiod's serving certificate Secret (--istiod-cert), by result (created, updated, unchanged, skipped: a Secret not ours, requeued, error).", "result"),
		istiodExpiry: f.gauge("istiod_cert_expiry_timestamp_seconds",
			"NotAfter of istiod's serving certificate in its Secret as a Unix time, as last seen by this replica while leading (--istiod-cert); 0 before."),
		rotations: f.counterVec("rotation_steps_total",
			"CA rotation steps taken by this replica as leader (prepare, activate, retire, remove).", "step"),
		leader: f.gauge("leader", "1 while this replica holds the leader lease."),
		clusterRequests: f.counterVec("cluster_requests_total",
			"Certificate requests by the cluster they came from (the local one, or a configured remote cluster; with --cluster-id only) and result.", "cluster", "result"),
		remoteReady: f.gaugeVec("remote_cluster_ready",
			"1 for a configured remote cluster whose pods and service accounts are indexed, 0 while its callers are refused as unavailable.", "cluster"),
		remoteRefused: f.counterVec("remote_cluster_kubeconfigs_refused_total",
			"Remote cluster kubeconfigs that configure nothing, by reason: invalid, too-large, context, exec, auth-provider, file, proxy, insecure-skip-tls-verify, not-https, no-ca, no-credential, basic-auth, impersonation (a Secret's kubeconfig may carry none of these; see docs/multi-cluster.md).", "reason"),
	}
	m.issued = m.requests.WithLabelValues(issuance.DoorGRPC, issuance.ResultIssued, "")
	m.issuedTime = m.issuance.WithLabelValues(issuance.DoorGRPC, issuance.ResultIssued)
	m.cacheHit = m.cacheLookups.WithLabelValues("hit")
	m.cacheMiss = m.cacheLookups.WithLabelValues("miss")
	// Exported from the start, so that dashboards and alerts see a zero
	// rather than no series while every token is verified locally.
	for _, r := range []string{"authenticated", "error"} {
		m.reviews.WithLabelValues(r)
	}
	for _, v := range []string{"accepted", "rejected", "undecided"} {
		m.local.WithLabelValues(v)
	}
	reg.MustRegister(
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(runtimeMetrics)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	build := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "build_info",
		Help:        "1, labelled with the running build: version, VCS revision, Go version.",
		ConstLabels: prometheus.Labels{"version": opts.Build.Version, "revision": opts.Build.Revision, "go_version": opts.Build.GoVersion}})
	build.Set(1)
	reg.MustRegister(build)
	if opts.IstioCompat {
		m.istio = newIstioCompat(reg)
	}
	return m
}

// RequestDone records one certificate request (issuance.Observer). The
// istiod-compatible counters count the gRPC door's alone, as istiod's do.
func (m *Metrics) RequestDone(door, result, reason string, d time.Duration) {
	if door == issuance.DoorGRPC && result == issuance.ResultIssued && reason == "" {
		m.issued.Inc()
		m.issuedTime.Observe(d.Seconds())
	} else {
		m.requests.WithLabelValues(door, result, reason).Inc()
		m.issuance.WithLabelValues(door, result).Observe(d.Seconds())
	}
	if door == issuance.DoorGRPC {
		m.istio.requestDone(result)
	}
}

// ReviewDone records one TokenReview call (tokenreview.Observer).
func (m *Metrics) ReviewDone(result string, d time.Duration) {
	m.reviews.WithLabelValues(result).Inc()
	m.reviewTime.Observe(d.Seconds())
}

// Forged records a token refused for its signature (tokenreview.Observer).
func (m *Metrics) Forged() { m.forged.Inc() }

// LocalDecision records a token judged by local verification
// (tokenreview.Observer).
func (m *Metrics) LocalDecision(verdict string) { m.local.WithLabelValues(verdict).Inc() }

// CacheLookup records a token review cache lookup (tokenreview.Observer).
func (m *Metrics) CacheLookup(hit bool) {
	if hit {
		m.cacheHit.Inc()
		return
	}
	m.cacheMiss.Inc()
}

// Published records a trust bundle reconciliation (trust.Observer).
func (m *Metrics) Published(result string) { m.published.WithLabelValues(result).Inc() }

// PodCertificate records a decided PodCertificateRequest (podcert.Observer).
func (m *Metrics) PodCertificate(result string) { m.podCerts.WithLabelValues(result).Inc() }

// PublishCounter counts reconciliations by result (configmap.Observer).
type PublishCounter struct{ c *prometheus.CounterVec }

// Published records one reconciliation.
func (p PublishCounter) Published(result string) { p.c.WithLabelValues(result).Inc() }

// RootConfigMaps counts the reconciliations of Istio's root ConfigMap.
func (m *Metrics) RootConfigMaps() PublishCounter { return PublishCounter{m.rootCMs} }

// IstiodCerts counts the reconciliations of istiod's certificate Secret.
func (m *Metrics) IstiodCerts() PublishCounter { return PublishCounter{m.istiodCerts} }

// IstiodCertExpiry records the end of istiod's certificate in its Secret.
func (m *Metrics) IstiodCertExpiry(notAfter time.Time) { m.istiodExpiry.Set(float64(notAfter.Unix())) }

// PolicyDecided records a decision of an issuance policy
// (policy.Observer).
func (m *Metrics) PolicyDecided(policy, decision string) {
	m.policies.WithLabelValues(policy, decision).Inc()
}

// PoliciesInstalled starts the decision counters of the issuance policies
// installed at zero, so that a first refusal is an increase an alert sees,
// and drops those of policies gone (watch.Observer).
func (m *Metrics) PoliciesInstalled(names []string, decisions []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	keep := map[string]bool{}
	for _, name := range names {
		keep[name] = true
		for _, d := range decisions {
			m.policies.WithLabelValues(name, d)
		}
	}
	for name := range m.policyNames {
		if !keep[name] {
			m.policies.DeletePartialMatch(prometheus.Labels{"policy": name})
		}
	}
	m.policyNames = keep
}

// Rotated records a rotation step (rotation.Observer).
func (m *Metrics) Rotated(step string) { m.rotations.WithLabelValues(step).Inc() }

// ClusterRequestDone counts a request of a cluster (issuance.ClusterObserver).
func (m *Metrics) ClusterRequestDone(cluster, result string) {
	m.clusterRequests.WithLabelValues(cluster, result).Inc()
}

// RemoteClusters records the configured remote clusters and whether each
// is ready (cluster.Observer); a removed cluster's series go.
func (m *Metrics) RemoteClusters(ready map[string]bool) {
	m.remoteReady.Reset()
	for id, ok := range ready {
		m.remoteReady.WithLabelValues(id).Set(boolf(ok))
	}
}

// RemoteKubeconfigRefused counts a remote cluster kubeconfig that
// configures nothing (cluster.Observer).
func (m *Metrics) RemoteKubeconfigRefused(reason string) {
	m.remoteRefused.WithLabelValues(reason).Inc()
}

// SetLeader records whether this replica leads.
func (m *Metrics) SetLeader(leading bool) {
	if leading {
		m.leader.Set(1)
		return
	}
	m.leader.Set(0)
}

// factory builds metrics in our namespace and registers them.
type factory struct{ reg prometheus.Registerer }

func (f factory) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	f.reg.MustRegister(c)
	return c
}

func (f factory) histogramVec(name, help string, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: latencyBuckets}, labels)
	f.reg.MustRegister(h)
	return h
}

func (f factory) histogram(name, help string) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: latencyBuckets})
	f.reg.MustRegister(h)
	return h
}

func (f factory) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	f.reg.MustRegister(c)
	return c
}

func (f factory) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, labels)
	f.reg.MustRegister(g)
	return g
}

func (f factory) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help})
	f.reg.MustRegister(g)
	return g
}
