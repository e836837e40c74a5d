package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// LeftOut is the gauge of federated trust domains whose roots a
// destination leaves out.
type LeftOut struct {
	g    *prometheus.GaugeVec
	mu   *sync.Mutex
	held map[[2]string]string // reason by (destination, trust domain)
}

// NewLeftOut registers workload_ca_federation_roots_left_out on reg.
func NewLeftOut(reg prometheus.Registerer) LeftOut {
	return LeftOut{g: factory{reg}.gaugeVec("federation_roots_left_out",
		"1 for a federated trust domain whose roots a destination (istio_root_configmap, cluster_trust_bundle) leaves out, by reason (invalid, over_size_budget, dns_not_constrained); no series while they are in.",
		"destination", "trust_domain", "reason"), mu: &sync.Mutex{}, held: map[[2]string]string{}}
}

// Set replaces what destination leaves out of the trust domains that
// match (each peer's ClusterTrustBundle reports only its own): reason by
// trust domain.
func (l LeftOut) Set(destination string, match func(trustDomain string) bool, reasons map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, r := range l.held {
		if k[0] == destination && match(k[1]) && reasons[k[1]] != r {
			l.g.DeleteLabelValues(destination, k[1], r)
			delete(l.held, k)
		}
	}
	for td, r := range reasons {
		l.g.WithLabelValues(destination, td, r).Set(1)
		l.held[[2]string{destination, td}] = r
	}
}
