package clustertrustbundle

import "github.com/workload-ca/workload-ca/internal/cliflag"

// Options are the flags of the ClusterTrustBundles the leader publishes.
type Options struct {
	Publish         bool
	SignerName      string
	IstioCompatible bool
}

// AddFlags defines the flags in the section Trust distribution.
func (o *Options) AddFlags(fs *cliflag.FlagSet) {
	fs.Section("Trust distribution (leader only)")
	fs.BoolVar(&o.Publish, "publish-trust-bundle", true, "publish the roots as ClusterTrustBundles (leader only)")
	fs.StringVar(&o.SignerName, "signer-name", DefaultSignerName, "signer name of the published ClusterTrustBundles, and of the PodCertificateRequests signed with --pod-certificates")
	fs.BoolVar(&o.IstioCompatible, "istio-compatible", false, "also publish the roots as istio.io:istiod-ca:root-cert, the bundle Istio's charts mount")
}

// ApplyTo sets the fields of cfg the flags decide.
func (o *Options) ApplyTo(cfg *Config) {
	cfg.SignerName, cfg.IstioCompatible = o.SignerName, o.IstioCompatible
}
