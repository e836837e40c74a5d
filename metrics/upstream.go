package metrics

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/workload-ca/workload-ca/ca/upstream"
)

// Upstream records the requests to an upstream CA (upstream.Observer)
// and exports, at scrape time, how long the active intermediate has left
// when its successor is overdue.
type Upstream struct {
	requests    *prometheus.CounterVec
	duration    prometheus.Histogram
	lastSuccess prometheus.Gauge
	now         func() time.Time
}

var noSuccessorDesc = desc("upstream_expiry_without_successor_seconds",
	"Seconds until the active upstream intermediate expires, exported only while its successor is overdue (the upstream has not issued it when the rotation asked): the time left to fix the upstream.")

// WatchUpstream registers the upstream metrics on reg; missing reports
// whether the successor is overdue and when the active intermediate
// expires, and now is the clock the time left is measured with.
func WatchUpstream(reg prometheus.Registerer, now func() time.Time, missing func() (time.Time, bool)) *Upstream {
	f := factory{reg}
	u := &Upstream{
		requests: f.counterVec("upstream_requests_total",
			"Requests to the upstream CA for an intermediate, by result (issued; error: unreachable or failed; refused: an answer the CA refused, such as a chain to an anchor that is not pinned).", "result"),
		duration:    f.histogram("upstream_request_duration_seconds", "Time the upstream CA took to answer a request for an intermediate."),
		lastSuccess: f.gauge("upstream_last_success_timestamp_seconds", "When the upstream CA last issued an intermediate this replica asked for, as a Unix time; 0: never since start."),
		now:         now,
	}
	for _, r := range []string{"issued", "error", "refused"} {
		u.requests.WithLabelValues(r)
	}
	reg.MustRegister(&funcCollector{
		descs: []*prometheus.Desc{noSuccessorDesc},
		collect: func(ch chan<- prometheus.Metric) {
			if expires, ok := missing(); ok {
				ch <- gauge(noSuccessorDesc, expires.Sub(u.now()).Seconds())
			}
		},
	})
	return u
}

// UpstreamRequest records one request to the upstream.
func (u *Upstream) UpstreamRequest(err error, took time.Duration) {
	u.duration.Observe(took.Seconds())
	switch {
	case errors.Is(err, upstream.ErrUpstream):
		u.requests.WithLabelValues("refused").Inc()
		return
	case err != nil:
		u.requests.WithLabelValues("error").Inc()
		return
	}
	u.requests.WithLabelValues("issued").Inc()
	u.lastSuccess.Set(float64(u.now().Unix()))
}
