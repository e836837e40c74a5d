package federation

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/internal/cliflag"
	"github.com/workload-ca/workload-ca/internal/component"
)

// Options are the flag of the federation configuration file.
type Options struct {
	File string
	// Config is File's checked contents (nil: no federation).
	Config *Config
}

// AddFlags defines the flag in the section Federation.
func (o *Options) AddFlags(fs *cliflag.FlagSet) {
	fs.Section("Federation")
	fs.StringVar(&o.File, "federation-config", "", "YAML file: a SPIFFE bundle endpoint serving our roots, and the trust domains whose bundles we import (see docs/federation.md)")
	fs.Example("federation-config", "/etc/workload-ca/federation.yaml")
}

// Validate loads the file for a CA of trust domain own (not checked
// without one: its own flag's error says why), and checks that the
// publishers its trust domains ask for are on: bundles for
// ClusterTrustBundles, rootConfigMaps for Istio's root ConfigMaps.
func (o *Options) Validate(own spiffeid.TrustDomain, bundles, rootConfigMaps bool) error {
	if o.File == "" || own == (spiffeid.TrustDomain{}) {
		return nil
	}
	var errs []error
	var err error
	if o.Config, err = Load(o.File, own); err != nil {
		errs = append(errs, fmt.Errorf("--federation-config: %w", err))
	}
	for _, p := range o.BundlePeers() {
		if !bundles {
			errs = append(errs, fmt.Errorf("--federation-config: trust domain %s: clusterTrustBundle needs --publish-trust-bundle", p))
		}
	}
	for _, p := range o.RootConfigMapPeers() {
		if !rootConfigMaps {
			errs = append(errs, fmt.Errorf("--federation-config: trust domain %s: istioRootConfigMap needs --istio-root-configmap", p))
		}
	}
	return errors.Join(errs...)
}

// BundlePeers are the trust domains whose roots join our
// ClusterTrustBundles (clusterTrustBundle in the file).
func (o *Options) BundlePeers() []spiffeid.TrustDomain {
	return o.peers(func(p Peer) bool { return p.ClusterTrustBundle })
}

// RootConfigMapPeers are the trust domains whose roots join Istio's root
// ConfigMap (istioRootConfigMap in the file).
func (o *Options) RootConfigMapPeers() []spiffeid.TrustDomain {
	return o.peers(func(p Peer) bool { return p.IstioRootConfigMap })
}

func (o *Options) peers(keep func(Peer) bool) []spiffeid.TrustDomain {
	var out []spiffeid.TrustDomain
	if o.Config != nil {
		for _, p := range o.Config.Peers {
			if keep(p) {
				out = append(out, p.TrustDomain)
			}
		}
	}
	return out
}

// EndpointWiring is what our bundle endpoint takes from the rest of the
// CA.
type EndpointWiring struct {
	TrustDomain spiffeid.TrustDomain
	Roots       func() []*x509.Certificate
	// SVID returns the certificate of an https_spiffe endpoint, for id.
	SVID   func(ctx context.Context, id spiffeid.ID) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), error)
	Logger *slog.Logger
}

// Endpoint makes our bundle endpoint, listening; ok is false when the
// file names none.
func (o *Options) Endpoint(ctx context.Context, w EndpointWiring) (c component.Component, ok bool, err error) {
	if o.Config == nil || o.Config.Endpoint == nil {
		return component.Component{}, false, nil
	}
	e := o.Config.Endpoint
	var getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	if e.Profile == ProfileWeb {
		fcert, err := NewFileCertificate(e.CertFile, e.KeyFile)
		if err != nil {
			return c, false, fmt.Errorf("--federation-config: endpoint: %w", err)
		}
		getCert = fcert.GetCertificate
	} else if getCert, err = w.SVID(ctx, e.SPIFFEID); err != nil {
		return c, false, fmt.Errorf("--federation-config: endpoint SVID: %w", err)
	}
	lis, err := net.Listen("tcp", e.Address)
	if err != nil {
		return c, false, fmt.Errorf("--federation-config: endpoint.address: %w", err)
	}
	srv, err := NewServer(ServerConfig{TrustDomain: w.TrustDomain, Roots: w.Roots,
		RefreshHint: e.RefreshHint, Listener: lis, GetCertificate: getCert, Logger: w.Logger})
	if err != nil {
		_ = lis.Close()
		return c, false, err
	}
	return component.Component{Name: "federation-endpoint", Run: srv.Run}, true, nil
}
