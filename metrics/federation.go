package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FederatedBundle is what the CA holds of one federated trust domain at
// scrape time.
type FederatedBundle struct {
	TrustDomain string
	// Roots is the number of X.509 authorities held; LastSuccess when the
	// bundle was last read or confirmed (zero: never); FetchErrors the
	// failed refreshes.
	Roots       int
	LastSuccess time.Time
	FetchErrors uint64
}

var (
	fedLastSuccessDesc = prometheus.NewDesc("workload_ca_federation_bundle_last_success_timestamp_seconds",
		"When the bundle of a federated trust domain was last fetched or read (0: never).", []string{"trust_domain"}, nil)
	fedAgeDesc = prometheus.NewDesc("workload_ca_federation_bundle_age_seconds",
		"Seconds since the bundle held of a federated trust domain was last fetched or read: it rises while its source fails (the last bundle is kept).", []string{"trust_domain"}, nil)
	fedRootsDesc = prometheus.NewDesc("workload_ca_federation_bundle_roots",
		"X.509 authorities held of a federated trust domain.", []string{"trust_domain"}, nil)
	fedErrorsDesc = prometheus.NewDesc("workload_ca_federation_fetch_errors_total",
		"Failed refreshes of a federated trust domain's bundle.", []string{"trust_domain"}, nil)
)

// WatchFederation exports the federated bundles held, read at each
// scrape; now is the clock the ages are measured with.
func WatchFederation(reg prometheus.Registerer, now func() time.Time, bundles func() []FederatedBundle) {
	reg.MustRegister(&funcCollector{
		descs: []*prometheus.Desc{fedLastSuccessDesc, fedAgeDesc, fedRootsDesc, fedErrorsDesc},
		collect: func(ch chan<- prometheus.Metric) {
			t := now()
			for _, b := range bundles() {
				last := 0.0
				if !b.LastSuccess.IsZero() {
					last = float64(b.LastSuccess.UnixMilli()) / 1000
					ch <- gauge(fedAgeDesc, t.Sub(b.LastSuccess).Seconds(), b.TrustDomain)
				}
				ch <- gauge(fedLastSuccessDesc, last, b.TrustDomain)
				ch <- gauge(fedRootsDesc, float64(b.Roots), b.TrustDomain)
				ch <- prometheus.MustNewConstMetric(fedErrorsDesc, prometheus.CounterValue, float64(b.FetchErrors), b.TrustDomain)
			}
		},
	})
}
