// Package admin serves the operator's HTTP endpoints on the admin port:
// /metrics (Prometheus, from the registry built in main), /healthz (the
// process is alive), /readyz (every readiness check passes) and, when
// enabled, /debug/pprof. It owns the readiness checks' aggregation and
// caching, not the checks themselves.
package admin
