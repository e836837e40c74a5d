package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/workload-ca/workload-ca/issuance"
)

// istioCompat exports the citadel_server_* counters istiod's CA exports, so
// dashboards and alerts written for istiod keep working.
type istioCompat struct {
	csr       prometheus.Counter
	success   prometheus.Counter
	authnFail prometheus.Counter
	parseErr  prometheus.Counter
	signErr   prometheus.Counter
}

func newIstioCompat(reg prometheus.Registerer) *istioCompat {
	c := func(name, help string) prometheus.Counter {
		m := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		reg.MustRegister(m)
		return m
	}
	return &istioCompat{
		csr:       c("citadel_server_csr_count", "The number of CSRs received (istiod-compatible)."),
		success:   c("citadel_server_success_cert_issuance_count", "The number of certificates issued successfully (istiod-compatible)."),
		authnFail: c("citadel_server_authentication_failure_count", "The number of authentication failures (istiod-compatible)."),
		parseErr:  c("citadel_server_csr_parsing_err_count", "The number of errors parsing CSRs (istiod-compatible)."),
		signErr:   c("citadel_server_csr_sign_err_count", "The number of errors signing CSRs (istiod-compatible)."),
	}
}

// requestDone maps our result to istiod's counters; a nil receiver (the
// option off) does nothing.
func (c *istioCompat) requestDone(result string) {
	if c == nil {
		return
	}
	c.csr.Inc()
	switch result {
	case issuance.ResultIssued:
		c.success.Inc()
	case issuance.ResultUnauthenticated, issuance.ResultDenied:
		c.authnFail.Inc() // istiod reports impersonation denials as authentication failures
	case issuance.ResultInvalid:
		c.parseErr.Inc()
	case issuance.ResultInternal:
		c.signErr.Inc()
	}
}
