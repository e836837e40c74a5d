package metrics

import (
	"crypto/x509"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// PodIndexStats is what the pod index reports at scrape time.
type PodIndexStats struct {
	Synced          bool
	Pods            int
	Nodes           int
	ServiceAccounts int
	Lookups         uint64
	LookupsRefused  uint64
}

// AuthnStats is what authentication reports at scrape time.
type AuthnStats struct {
	// PendingReviews are the TokenReviews queued or in flight.
	PendingReviews int
	// QueuedRequests are the certificate requests waiting for a signing
	// slot.
	QueuedRequests int
	// Accounts is the size of the service account index, and
	// AccountsSynced whether it has loaded its first list.
	Accounts       int
	AccountsSynced bool
}

// WatchAuthn exports the TokenReview queue, the signing queue and the
// service account index, read at each scrape.
func WatchAuthn(reg prometheus.Registerer, stats func() AuthnStats) {
	reg.MustRegister(&funcCollector{
		descs: []*prometheus.Desc{pendingDesc, queuedDesc, accountsDesc, accountsSyncedDesc},
		collect: func(ch chan<- prometheus.Metric) {
			s := stats()
			ch <- gauge(pendingDesc, float64(s.PendingReviews))
			ch <- gauge(queuedDesc, float64(s.QueuedRequests))
			ch <- gauge(accountsDesc, float64(s.Accounts))
			ch <- gauge(accountsSyncedDesc, boolf(s.AccountsSynced))
		},
	})
}

// CAState is the CA's certificates at scrape time.
type CAState struct {
	Signing       *x509.Certificate
	Intermediates []*x509.Certificate
	Roots         []*x509.Certificate
	Serving       *x509.Certificate
	// Phase is the rotation phase (steady, prepared, retiring), empty when
	// the CA does not rotate itself.
	Phase string
	// NextStep is the rotation step due next and NextStepAt when; empty
	// when none is planned.
	NextStep   string
	NextStepAt time.Time
}

// rotationPhases are the values Phase may take, exported as a one-hot gauge.
var rotationPhases = []string{"steady", "prepared", "retiring"}

// WatchPodIndex exports the pod index's size, sync state and live lookups,
// read at each scrape.
func WatchPodIndex(reg prometheus.Registerer, stats func() PodIndexStats) {
	reg.MustRegister(&funcCollector{
		descs: []*prometheus.Desc{podsDesc, nodesDesc, sasDesc, syncedDesc, lookupsDesc},
		collect: func(ch chan<- prometheus.Metric) {
			s := stats()
			ch <- gauge(podsDesc, float64(s.Pods))
			ch <- gauge(nodesDesc, float64(s.Nodes))
			ch <- gauge(sasDesc, float64(s.ServiceAccounts))
			ch <- gauge(syncedDesc, boolf(s.Synced))
			ch <- prometheus.MustNewConstMetric(lookupsDesc, prometheus.CounterValue, float64(s.Lookups), "made")
			ch <- prometheus.MustNewConstMetric(lookupsDesc, prometheus.CounterValue, float64(s.LookupsRefused), "refused")
		},
	})
}

// WatchCA exports certificate expiry times and the rotation phase, read at
// each scrape. Roots report the latest expiry among them (the one that
// matters once a rotation has finished); intermediates the earliest.
func WatchCA(reg prometheus.Registerer, state func() CAState) {
	reg.MustRegister(&funcCollector{
		descs: []*prometheus.Desc{expiryDesc, servingExpiryDesc, phaseDesc, rootsDesc, nextStepDesc},
		collect: func(ch chan<- prometheus.Metric) {
			s := state()
			if s.Signing != nil {
				ch <- gauge(expiryDesc, unix(s.Signing), "signing")
			}
			if c := latest(s.Roots); c != nil {
				ch <- gauge(expiryDesc, unix(c), "root")
			}
			if c := earliest(s.Intermediates); c != nil {
				ch <- gauge(expiryDesc, unix(c), "intermediate")
			}
			if s.Serving != nil {
				ch <- gauge(servingExpiryDesc, unix(s.Serving))
			}
			ch <- gauge(rootsDesc, float64(len(s.Roots)))
			if s.NextStep != "" {
				ch <- gauge(nextStepDesc, float64(s.NextStepAt.Unix()), s.NextStep)
			}
			if s.Phase != "" {
				for _, p := range rotationPhases {
					ch <- gauge(phaseDesc, boolf(p == s.Phase), p)
				}
			}
		},
	})
}

// WatchCAIstio exports, from state at scrape time, the expiry gauges of
// istiod's CA that Istio's dashboards read: the newest root's NotAfter and
// the certificate chain's (the first of the signing certificate and the
// intermediates to end), in Unix seconds.
func WatchCAIstio(reg prometheus.Registerer, state func() CAState) {
	root := prometheus.NewDesc("citadel_server_root_cert_expiry_timestamp",
		"The unix timestamp, in seconds, when the root certificate will expire (istiod-compatible).", nil, nil)
	chain := prometheus.NewDesc("citadel_server_cert_chain_expiry_timestamp",
		"The unix timestamp, in seconds, when the CA certificate chain will expire (istiod-compatible).", nil, nil)
	reg.MustRegister(&funcCollector{
		descs: []*prometheus.Desc{root, chain},
		collect: func(ch chan<- prometheus.Metric) {
			s := state()
			if c := latest(s.Roots); c != nil {
				ch <- gauge(root, unix(c))
			}
			chainCerts := s.Intermediates
			if s.Signing != nil {
				chainCerts = append([]*x509.Certificate{s.Signing}, chainCerts...)
			}
			if c := earliest(chainCerts); c != nil {
				ch <- gauge(chain, unix(c))
			}
		},
	})
}

var (
	podsDesc    = desc("podindex_pods", "Live scheduled pods in the pod index.")
	nodesDesc   = desc("podindex_nodes", "Nodes with pods in the pod index.")
	sasDesc     = desc("podindex_service_accounts", "Service accounts with pods in the pod index.")
	syncedDesc  = desc("podindex_synced", "1 once the pod index has completed its initial list.")
	lookupsDesc = desc("podindex_live_lookups_total", "Live API lookups on pod index misses, by result (made, refused by the rate limiter).", "result")

	pendingDesc        = desc("tokenreview_pending", "TokenReviews queued or in flight.")
	queuedDesc         = desc("sign_queue_length", "Certificate requests waiting for a signing slot.")
	accountsDesc       = desc("saindex_service_accounts", "Service accounts in the index the token checks read.")
	accountsSyncedDesc = desc("saindex_synced", "1 once the service account index has completed its initial list.")

	expiryDesc        = desc("ca_cert_expiry_timestamp_seconds", "NotAfter of the CA certificates as a Unix time, by kind (signing, root, intermediate).", "kind")
	servingExpiryDesc = desc("serving_cert_expiry_timestamp_seconds", "NotAfter of the gRPC serving certificate as a Unix time.")
	rootsDesc         = desc("trust_bundle_roots", "Roots in the trust bundle (more than one during a rotation).")
	phaseDesc         = desc("rotation_phase", "1 for the current CA rotation phase.", "phase")
	nextStepDesc      = desc("rotation_next_step_timestamp_seconds", "When the rotation plan's next step is due, as a Unix time, by step; one far in the past is a rotation that is stuck.", "step")
)

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(namespace+"_"+name, help, labels, nil)
}

func gauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func unix(c *x509.Certificate) float64 { return float64(c.NotAfter.Unix()) }

func latest(certs []*x509.Certificate) *x509.Certificate {
	var out *x509.Certificate
	for _, c := range certs {
		if out == nil || c.NotAfter.After(out.NotAfter) {
			out = c
		}
	}
	return out
}

func earliest(certs []*x509.Certificate) *x509.Certificate {
	var out *x509.Certificate
	for _, c := range certs {
		if out == nil || c.NotAfter.Before(out.NotAfter) {
			out = c
		}
	}
	return out
}

// funcCollector collects const metrics computed at scrape time.
type funcCollector struct {
	descs   []*prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c *funcCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *funcCollector) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }
