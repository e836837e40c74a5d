package main

import (
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/trust/federation"
)

// Istio's root ConfigMaps hold our roots, then those of the federated
// trust domains that ask for it, and no others.
func TestRootConfigMapRootsAddMarkedPeers(t *testing.T) {
	own := testca.NewRoot(t, testca.P256)
	authority, err := ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local")}, own.Material())
	if err != nil {
		t.Fatal(err)
	}
	east, west := testca.NewRoot(t, testca.P256).Cert, testca.NewRoot(t, testca.P256).Cert
	im, err := federation.NewImporter(federation.ImporterConfig{Peers: []federation.Peer{
		{TrustDomain: spiffeid.RequireTrustDomainFromString("east.example"), BundleFile: testca.WritePEM(t, east), IstioRootConfigMap: true},
		{TrustDomain: spiffeid.RequireTrustDomainFromString("west.example"), BundleFile: testca.WritePEM(t, west)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	a := &app{authority: authority}
	if got := a.rootConfigMapRoots(); len(got) != 1 || !got[0].Equal(own.Cert) {
		t.Fatalf("without federation: %d roots, want ours", len(got))
	}
	a.importer = im
	got := a.rootConfigMapRoots()
	if len(got) != 2 || !got[0].Equal(own.Cert) || !got[1].Equal(east) {
		t.Fatalf("%d roots; want ours, then east's only", len(got))
	}
}
