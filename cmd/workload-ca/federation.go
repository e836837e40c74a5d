package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/internal/component"
	"github.com/workload-ca/workload-ca/metrics"
	"github.com/workload-ca/workload-ca/server"
	"github.com/workload-ca/workload-ca/trust"
	"github.com/workload-ca/workload-ca/trust/clustertrustbundle"
	"github.com/workload-ca/workload-ca/trust/federation"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

// rootConfigMapPeers are the roots held of the federated trust domains
// marked istioRootConfigMap, which join ours in Istio's root ConfigMaps
// when they pass its checks (configmap.Config.Peers).
func (a *app) rootConfigMapPeers() []rootset.Peer {
	if a.importer == nil {
		return nil
	}
	var out []rootset.Peer
	for _, p := range a.cfg.Federation.Peers {
		if p.IstioRootConfigMap {
			out = append(out, rootset.Peer{TrustDomain: p.TrustDomain, Roots: a.importer.Roots(p.TrustDomain)})
		}
	}
	return out
}

// ourDNSDomains are the DNS domains, besides configmap.DefaultDNSDomains,
// that no federated root in Istio's root ConfigMaps may vouch for: our
// trust domain's name (Istio's default cluster domain is the trust
// domain) and istiod's names.
func (a *app) ourDNSDomains() []string {
	return append([]string{a.cfg.TrustDomain.Name()}, a.cfg.istiodNames()...)
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
	fc := a.cfg.Federation
	if fc == nil {
		return nil
	}
	log := a.log.With("component", "federation")
	if len(fc.Peers) > 0 {
		a.leftOut = metrics.NewLeftOut(a.reg)
		a.peerTriggers = map[spiffeid.TrustDomain][]func(){}
		im, err := federation.NewImporter(federation.ImporterConfig{Peers: fc.Peers, ZtunnelRoots: a.authority.SetPeerRoots, OwnRoots: a.authority.Roots, Logger: log,
			ClusterTrustBundles: func(ctx context.Context, sel federation.BundleSelectorFile) ([]*x509.Certificate, error) {
				return clustertrustbundle.SelectRoots(ctx, a.kube.bundles, sel.SignerName, sel.MatchLabels)
			},
			OnChange: func(td spiffeid.TrustDomain) {
				for _, t := range a.peerTriggers[td] {
					t()
				}
			}})
		if err != nil {
			return fmt.Errorf("--federation-config: %w", err)
		}
		for _, p := range fc.Peers {
			if !p.ClusterTrustBundle {
				continue
			}
			name := "trustbundle-" + p.TrustDomain.Name()
			pub, err := clustertrustbundle.New(clustertrustbundle.Config{Client: a.kube.bundles, SignerName: a.cfg.SignerName,
				PeerTrustDomain: p.TrustDomain, LeftOut: a.leftOutMetric("cluster_trust_bundle", func(td string) bool { return td == p.TrustDomain.Name() }), Options: trust.Options{TrustDomain: a.cfg.TrustDomain,
					Roots: func() []*x509.Certificate { return im.Roots(p.TrustDomain) }, Observer: a.metrics,
					Logger: a.log.With("component", name)}})
			if err != nil {
				return err
			}
			a.peerTriggers[p.TrustDomain] = append(a.peerTriggers[p.TrustDomain], pub.Trigger)
			a.add(component.Component{Name: name, Leader: true, Run: pub.Run})
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
	}
	e := fc.Endpoint
	if e == nil {
		return nil
	}
	var getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	if e.Profile == federation.ProfileWeb {
		fcert, err := federation.NewFileCertificate(e.CertFile, e.KeyFile)
		if err != nil {
			return fmt.Errorf("--federation-config: endpoint: %w", err)
		}
		getCert = fcert.GetCertificate
	} else {
		svid, err := server.NewServingCert(ctx, server.ServingCertConfig{Issuer: a.authority, SPIFFEID: e.SPIFFEID,
			TTL: a.cfg.ServingTTL, Logger: log})
		if err != nil {
			return fmt.Errorf("--federation-config: endpoint SVID: %w", err)
		}
		getCert = svid.GetCertificate
	}
	lis, err := net.Listen("tcp", e.Address)
	if err != nil {
		return fmt.Errorf("--federation-config: endpoint.address: %w", err)
	}
	srv, err := federation.NewServer(federation.ServerConfig{TrustDomain: a.cfg.TrustDomain, Roots: a.authority.Roots,
		RefreshHint: e.RefreshHint, Listener: lis, GetCertificate: getCert, Logger: log})
	if err != nil {
		_ = lis.Close()
		return err
	}
	a.add(component.Component{Name: "federation-endpoint", Run: srv.Run})
	return nil
}
