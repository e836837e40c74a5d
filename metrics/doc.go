// Package metrics defines every Prometheus metric of the CA on a registry
// created by the caller (no global registration), and implements the small
// observer interfaces the other packages declare (issuance, server, tokenreview,
// clustertrustbundle, configmap, rotation). Gauges of state that already lives elsewhere (the
// pod index, CA expiry) are computed at scrape time from functions, so no
// copy of that state is kept here.
//
// No label carries an unbounded value: no SPIFFE ID, pod name or serial.
package metrics
