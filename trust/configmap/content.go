package configmap

import (
	"context"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/trust/rootset"
)

// The ConfigMap Istio's sidecars and ztunnel mount to verify the CA.
const (
	// ConfigMapName is the ConfigMap published in every selected namespace.
	ConfigMapName = "istio-ca-root-cert"
	// DataKey is the key holding the PEM roots.
	DataKey = "root-cert.pem"
	// FieldManager is the field manager of our writes; any other manager
	// of DataKey is another writer.
	FieldManager = "workload-ca"
)

// Labels set on every ConfigMap we publish.
const (
	LabelManagedBy   = "app.kubernetes.io/managed-by"
	ManagedBy        = "workload-ca"
	LabelTrustDomain = "workload-ca.io/trust-domain"
	// LabelIstioConfig is the label istiod puts on the ConfigMaps it
	// publishes; we keep it so that tools selecting Istio's objects by it
	// still find ours.
	LabelIstioConfig = "istio.io/config"
)

// ErrInvalidRoots is wrapped when our roots cannot be published: none, one
// that is not a CA certificate, or over ContentBudget. Nothing is changed
// in the cluster then; existing ConfigMaps stay. A federated trust
// domain's roots never cause it: they are left out instead.
var ErrInvalidRoots = rootset.ErrInvalid

// ContentBudget is the most PEM the ConfigMap holds: a copy lives in every
// selected namespace (and in etcd), and the API's limit for a whole
// ConfigMap is 1 MiB. Our roots alone over it are ErrInvalidRoots; a
// federated trust domain whose roots would take the content past it is
// left out.
const ContentBudget = 256 << 10

// DefaultDNSDomains are the DNS domains no federated root in the ConfigMap
// may be able to vouch for: Kubernetes services (<svc>.<ns>.svc, istiod's
// names among them) and the default cluster domain.
var DefaultDNSDomains = []string{"svc", "cluster.local"}

// content returns the ConfigMap's roots: ours and those of every peer that
// passes the checks, and reports the peers left out.
func (p *Publisher) content(ctx context.Context) (string, error) {
	var peers []rootset.Peer
	if p.peers != nil {
		peers = p.peers()
	}
	content, left, err := p.compose.Compose(p.opts.Roots(), peers)
	if err != nil {
		return "", err
	}
	p.leftOut.Report(ctx, left)
	return content, nil
}

// ownLabels returns the labels of our ConfigMaps in trust domain td.
func ownLabels(td spiffeid.TrustDomain) map[string]string {
	return map[string]string{
		LabelManagedBy:   ManagedBy,
		LabelTrustDomain: td.Name(),
		LabelIstioConfig: "true",
	}
}
