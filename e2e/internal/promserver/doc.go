// Package promserver runs the Prometheus tools the e2e suite checks the
// CA's metrics with: a real Prometheus server scraping the CA (Start),
// promtool's linter (CheckMetrics), and a reader of the text exposition
// format (ParseText).
//
// The binaries come from PATH (Debian's prometheus package installs
// /usr/bin/prometheus and /usr/bin/promtool; `make prometheus-tools`
// installs it). The server is started through e2e/internal/proc, so it is
// killed with the test binary.
package promserver
