package configmap

import (
	"fmt"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// Options are the flags of Istio's root ConfigMaps the leader publishes.
type Options struct {
	Publish bool
	// Namespaces selects the namespaces that get the ConfigMap.
	Namespaces labels.Selector
	selector   string
}

// AddFlags defines the flags in the section Trust distribution.
func (o *Options) AddFlags(fs *cliflag.FlagSet) {
	fs.Section("Trust distribution (leader only)")
	fs.BoolVar(&o.Publish, "istio-root-configmap", false, "publish the roots as Istio's istio-ca-root-cert ConfigMap in every namespace (leader only), which sidecars and ztunnel mount unless Istio reads ClusterTrustBundles")
	fs.StringVar(&o.selector, "istio-root-configmap-namespaces", "", "label selector of the namespaces that get the istio-ca-root-cert ConfigMap; empty: all")
	fs.Example("istio-root-configmap-namespaces", "istio-injection=enabled")
}

// Validate parses the namespace selector.
func (o *Options) Validate() error {
	var err error
	if o.Namespaces, err = labels.Parse(o.selector); err != nil {
		return fmt.Errorf("--istio-root-configmap-namespaces: %w", err)
	}
	return nil
}

// ApplyTo sets the fields of cfg the flags decide.
func (o *Options) ApplyTo(cfg *Config) { cfg.NamespaceSelector = o.Namespaces }
