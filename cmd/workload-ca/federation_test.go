package main

import (
	"slices"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/trust/federation"
)

// Istio's root ConfigMaps are offered the roots of the federated trust
// domains that ask for it, and no others; configmap judges each.
func TestRootConfigMapPeersAreMarkedPeers(t *testing.T) {
	east, west := testca.NewRoot(t, testca.P256).Cert, testca.NewRoot(t, testca.P256).Cert
	eastTD := spiffeid.RequireTrustDomainFromString("east.example")
	fc := &federation.Config{Peers: []federation.Peer{
		{TrustDomain: eastTD, BundleFile: testca.WritePEM(t, east), IstioRootConfigMap: true},
		{TrustDomain: spiffeid.RequireTrustDomainFromString("west.example"), BundleFile: testca.WritePEM(t, west)},
	}}
	im, err := federation.NewImporter(federation.ImporterConfig{Peers: fc.Peers})
	if err != nil {
		t.Fatal(err)
	}
	a := &app{}
	a.opts.federation.Config = fc
	a.opts.material.TrustDomain = spiffeid.RequireTrustDomainFromString("mesh.example")
	a.opts.istiod.Namespace = "istio-system"
	if got := a.rootConfigMapPeers(); len(got) != 0 {
		t.Fatalf("without an importer: %d peers, want none", len(got))
	}
	a.importer = im
	got := a.rootConfigMapPeers()
	if len(got) != 1 || got[0].TrustDomain != eastTD {
		t.Fatalf("peers %v; want east's only", got)
	}
	if d := a.ourDNSDomains(); !slices.Equal(d, []string{"mesh.example", "istiod.istio-system.svc"}) {
		t.Fatalf("our DNS domains %v", d)
	}
}
