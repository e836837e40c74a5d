package configmap

import (
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

// ErrInvalidRoots is wrapped when the roots cannot be published: none, or
// one that is not a CA certificate. Nothing is changed in the cluster then;
// existing ConfigMaps stay.
var ErrInvalidRoots = rootset.ErrInvalid

// ownLabels returns the labels of our ConfigMaps in trust domain td.
func ownLabels(td spiffeid.TrustDomain) map[string]string {
	return map[string]string{
		LabelManagedBy:   ManagedBy,
		LabelTrustDomain: td.Name(),
		LabelIstioConfig: "true",
	}
}
