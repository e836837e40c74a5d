//go:build tools

// Package istiotools pins istiod (pilot-discovery, from the istio.io/istio
// module), which the e2e suite runs against the real API server to show
// that its xDS port verifies with workload-ca's root. It is a module of its
// own so that Istio's dependencies cannot move those of the control plane
// (e2e/tools) or of the product.
package istiotools

import _ "istio.io/istio/pilot/cmd/pilot-discovery"
