package metrics

import "github.com/prometheus/client_golang/prometheus"

// LeftOut is the gauge of federated trust domains whose roots a
// destination leaves out.
type LeftOut struct{ g *prometheus.GaugeVec }

// NewLeftOut registers workload_ca_federation_roots_left_out on reg.
func NewLeftOut(reg prometheus.Registerer) LeftOut {
	return LeftOut{factory{reg}.gaugeVec("federation_roots_left_out",
		"1 for a federated trust domain whose roots a destination (istio_root_configmap) leaves out, by reason (invalid, over_size_budget, dns_not_constrained); no series while they are in.",
		"destination", "trust_domain", "reason")}
}

// Set replaces what destination leaves out: reason by trust domain.
func (l LeftOut) Set(destination string, reasons map[string]string) {
	l.g.DeletePartialMatch(prometheus.Labels{"destination": destination})
	for td, r := range reasons {
		l.g.WithLabelValues(destination, td, r).Set(1)
	}
}
