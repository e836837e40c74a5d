// Package federation joins the CA to other SPIFFE trust domains: it
// serves our bundle at a SPIFFE bundle endpoint and imports the bundles of
// the trust domains we federate with, each from its bundle endpoint or a
// file, keeping the last good bundle when a refresh fails. go-spiffe
// speaks the format (SPIFFE Trust Domain and Bundle specification,
// https_web and https_spiffe profiles); the fetches are our own, bounded
// in time and size, and every bundle imported passes CheckBundle (a few
// CA roots, none of them ours) before it replaces the one held.
//
// The configuration is a small YAML file (--federation-config); see
// docs/federation.md.
//
// Its Options are the --federation-config flag: the file loaded and
// checked against the publishers it needs, the trust domains it lists,
// and our bundle endpoint built from it (Options.Endpoint).
//
// It does not own: our roots (the authority hands them over as a
// function), where imported bundles are published (cmd hands them to
// ztunnel's roots through the authority, and to the ClusterTrustBundle and
// ConfigMap publishers of trust/), or metrics (metrics reads the bundles
// held at scrape time).
package federation
