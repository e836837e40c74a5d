package metrics_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/workload-ca/workload-ca/ca/upstream"
	"github.com/workload-ca/workload-ca/metrics"
)

// An answer the CA refused (an anchor that is not pinned) is counted
// apart from an upstream that failed.
func TestUpstreamRequestResults(t *testing.T) {
	reg := prometheus.NewRegistry()
	u := metrics.WatchUpstream(reg, time.Now, func() (time.Time, bool) { return time.Time{}, false })
	u.UpstreamRequest(nil, time.Millisecond)
	u.UpstreamRequest(errors.New("connection refused"), time.Millisecond)
	u.UpstreamRequest(fmt.Errorf("%w: %w", upstream.ErrUpstream, upstream.ErrAnchorChange), time.Millisecond)
	want := `
# HELP workload_ca_upstream_requests_total Requests to the upstream CA for an intermediate, by result (issued; error: unreachable or failed; refused: an answer the CA refused, such as a chain to an anchor that is not pinned).
# TYPE workload_ca_upstream_requests_total counter
workload_ca_upstream_requests_total{result="error"} 1
workload_ca_upstream_requests_total{result="issued"} 1
workload_ca_upstream_requests_total{result="refused"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "workload_ca_upstream_requests_total"); err != nil {
		t.Fatal(err)
	}
}
