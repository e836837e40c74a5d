package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/internal/component"
	"github.com/workload-ca/workload-ca/istiodcert"
	"github.com/workload-ca/workload-ca/metrics"
	"github.com/workload-ca/workload-ca/server"
	"github.com/workload-ca/workload-ca/trust/clustertrustbundle"
	"github.com/workload-ca/workload-ca/trust/configmap"
	"github.com/workload-ca/workload-ca/trust/federation"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

// The trust publishers (leader only) and federation (every replica): the
// roots go to ClusterTrustBundles, Istio's root ConfigMaps and istiod's
// certificate; the federated trust domains' roots go to ztunnel's answer
// and to the publishers that ask for them.

// publishBundles makes the leader publish the roots as ClusterTrustBundles.
func (a *app) publishBundles(context.Context) error {
	if !a.opts.bundles.Publish {
		return nil
	}
	var preview func() []*x509.Certificate // nil: no preview stage
	if a.opts.material.Preview > 0 && a.opts.material.Secret.Name != "" {
		preview = a.source.Preview
	}
	cfg := clustertrustbundle.Config{Client: a.kube.Bundles, Preview: preview, Options: a.publisherOptions(a.metrics, "trustbundle")}
	a.opts.bundles.ApplyTo(&cfg)
	p, err := clustertrustbundle.New(cfg)
	if err != nil {
		return err
	}
	a.addPublisher("trustbundle", p)
	return nil
}

// publishRootConfigMaps makes the leader publish the roots as Istio's
// istio-ca-root-cert ConfigMap, with those of the federated trust domains
// that ask for it.
func (a *app) publishRootConfigMaps(context.Context) error {
	if !a.opts.rootCMs.Publish {
		return nil
	}
	cfg := configmap.Config{Client: a.kube.RootConfigMaps, Options: a.publisherOptions(a.metrics.RootConfigMaps(), "rootconfigmap")}
	a.opts.rootCMs.ApplyTo(&cfg)
	peers := a.opts.federation.RootConfigMapPeers()
	if len(peers) > 0 {
		cfg.Peers, cfg.OurDNSDomains, cfg.LeftOut = a.rootConfigMapPeers, a.ourDNSDomains(),
			a.leftOutMetric("istio_root_configmap", func(string) bool { return true })
	}
	p, err := configmap.New(cfg)
	if err != nil {
		return err
	}
	for _, td := range peers {
		a.peerTriggers[td] = append(a.peerTriggers[td], p.Trigger)
	}
	a.addPublisher("rootconfigmap", p)
	return nil
}

// keepIstiodCert makes the leader keep istiod's serving certificate in
// the Secret Istio's chart mounts.
func (a *app) keepIstiodCert(context.Context) error {
	if !a.opts.istiod.Enabled {
		return nil
	}
	cfg := istiodcert.Config{Client: a.kube.IstiodCert, Issuer: a.authority, Holding: a.metrics.IstiodCertExpiry,
		Options: a.publisherOptions(a.metrics.IstiodCerts(), "istiodcert")}
	a.opts.istiod.ApplyTo(&cfg)
	p, err := istiodcert.New(cfg)
	if err != nil {
		return err
	}
	a.addPublisher("istiodcert", p)
	return nil
}

// addPublisher makes the leader run publisher p, triggered whenever the
// CA's material changes.
func (a *app) addPublisher(name string, p interface {
	Trigger()
	Run(ctx context.Context) error
}) {
	a.source.OnChange(p.Trigger)
	a.add(component.Component{Name: name, Leader: true, Run: p.Run})
}

// rootConfigMapPeers are the roots held of the federated trust domains
// marked istioRootConfigMap, which join ours in Istio's root ConfigMaps
// when they pass its checks (configmap.Config.Peers).
func (a *app) rootConfigMapPeers() []rootset.Peer {
	if a.importer == nil {
		return nil
	}
	var out []rootset.Peer
	for _, td := range a.opts.federation.RootConfigMapPeers() {
		out = append(out, rootset.Peer{TrustDomain: td, Roots: a.importer.Roots(td)})
	}
	return out
}

// ourDNSDomains are the DNS domains, besides configmap.DefaultDNSDomains,
// that no federated root in Istio's root ConfigMaps may vouch for: our
// trust domain's name (Istio's default cluster domain is the trust
// domain) and istiod's names.
func (a *app) ourDNSDomains() []string {
	return append([]string{a.opts.material.TrustDomain.Name()}, a.opts.istiod.Names()...)
}

// leftOutMetric exports the peers a destination leaves out as
// workload_ca_federation_roots_left_out.
func (a *app) leftOutMetric(destination string, match func(trustDomain string) bool) func([]rootset.LeftOut) {
	return func(left []rootset.LeftOut) {
		reasons := make(map[string]string, len(left))
		for _, l := range left {
			reasons[l.TrustDomain.Name()] = l.Reason
		}
		a.leftOut.Set(destination, match, reasons)
	}
}

// federate wires --federation-config on every replica: the importer of
// the other trust domains' bundles (the ztunnel ones go to the answer's
// root element), the leader's ClusterTrustBundles of those that ask for
// them, and our bundle endpoint. It runs before the other trust
// publishers are wired, which read what it imports.
func (a *app) federate(ctx context.Context) error {
	a.peerTriggers = map[spiffeid.TrustDomain][]func(){}
	fc := a.opts.federation.Config
	if fc == nil {
		return nil
	}
	if len(fc.Peers) > 0 {
		if err := a.importPeers(fc.Peers); err != nil {
			return err
		}
	}
	c, ok, err := a.opts.federation.Endpoint(ctx, federation.EndpointWiring{TrustDomain: a.opts.material.TrustDomain,
		Roots: a.authority.Roots, SVID: a.endpointSVID, Logger: a.log.With("component", "federation")})
	if ok {
		a.add(c)
	}
	return err
}

// importPeers imports the federated trust domains' bundles, and publishes
// as ClusterTrustBundles those that ask for it.
func (a *app) importPeers(peers []federation.Peer) error {
	a.leftOut = metrics.NewLeftOut(a.reg)
	im, err := federation.NewImporter(federation.ImporterConfig{Peers: peers, ZtunnelRoots: a.authority.SetPeerRoots,
		OwnRoots: a.authority.Roots, Logger: a.log.With("component", "federation"),
		ClusterTrustBundles: func(ctx context.Context, sel federation.BundleSelectorFile) ([]*x509.Certificate, error) {
			return clustertrustbundle.SelectRoots(ctx, a.kube.Bundles, sel.SignerName, sel.MatchLabels)
		},
		OnChange: func(td spiffeid.TrustDomain) {
			for _, t := range a.peerTriggers[td] {
				t()
			}
		}})
	if err != nil {
		return fmt.Errorf("--federation-config: %w", err)
	}
	for _, p := range peers {
		if p.ClusterTrustBundle {
			if err := a.publishPeerBundle(im, p.TrustDomain); err != nil {
				return err
			}
		}
	}
	metrics.WatchFederation(a.reg, time.Now, func() []metrics.FederatedBundle {
		var out []metrics.FederatedBundle
		for _, s := range im.States() {
			out = append(out, metrics.FederatedBundle{TrustDomain: s.TrustDomain, Roots: s.Roots, LastSuccess: s.LastSuccess, FetchErrors: s.FetchErrors})
		}
		return out
	})
	a.add(component.Component{Name: "federation-import", Run: im.Run})
	a.importer = im
	return nil
}

// publishPeerBundle makes the leader publish the roots of federated trust
// domain td as ClusterTrustBundles.
func (a *app) publishPeerBundle(im *federation.Importer, td spiffeid.TrustDomain) error {
	name := "trustbundle-" + td.Name()
	opts := a.publisherOptions(a.metrics, name)
	opts.Roots = func() []*x509.Certificate { return im.Roots(td) }
	cfg := clustertrustbundle.Config{Client: a.kube.Bundles, SignerName: a.opts.bundles.SignerName, PeerTrustDomain: td,
		LeftOut: a.leftOutMetric("cluster_trust_bundle", func(name string) bool { return name == td.Name() }), Options: opts}
	pub, err := clustertrustbundle.New(cfg)
	if err != nil {
		return err
	}
	a.peerTriggers[td] = append(a.peerTriggers[td], pub.Trigger)
	a.add(component.Component{Name: name, Leader: true, Run: pub.Run})
	return nil
}

// endpointSVID is the certificate of an https_spiffe bundle endpoint:
// an SVID for id the authority issues, kept fresh.
func (a *app) endpointSVID(ctx context.Context, id spiffeid.ID) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), error) {
	svid, err := server.NewServingCert(ctx, server.ServingCertConfig{Issuer: a.authority, SPIFFEID: id,
		TTL: a.opts.serving.ServingTTL, Logger: a.log.With("component", "federation")})
	if err != nil {
		return nil, err
	}
	return svid.GetCertificate, nil
}
