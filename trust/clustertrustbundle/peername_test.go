package clustertrustbundle

import (
	"context"
	"crypto/x509"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testlog"
	"github.com/workload-ca/workload-ca/trust"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

// TestPeerBundleEqualToOursDoesNotFlap: a peer
// serving our own public bundle got the same content-addressed name as
// our bundle under our signer, and the two publishers relabelled that one
// object back and forth (hundreds of updates a second), so pods selecting
// our trust domain intermittently matched nothing. Peer bundles are now
// named apart: both publishers settle with one create each and, over
// repeated full reconciles, no update.
func TestPeerBundleEqualToOursDoesNotFlap(t *testing.T) {
	roots := testca.RootCerts(t, 1)
	peer := spiffeid.RequireTrustDomainFromString("east.example")
	client := fake.NewClientset()
	rs := &testca.Roots{}
	rs.Set(roots[0])
	var runs []*run
	for _, td := range []spiffeid.TrustDomain{{}, peer} {
		p, err := New(Config{Client: client, PeerTrustDomain: td, Options: trust.Options{TrustDomain: testTD,
			Roots: rs.Get, Logger: testlog.New(t)}})
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, newRun(p, v1API(client)))
	}
	// The two publishers take turns, each with its cache as the informer
	// would have it.
	for range 20 {
		for _, r := range runs {
			syncStores(t, client, r)
			if _, err := r.reconcile(context.Background(), DefaultSignerName); err != nil {
				t.Fatal(err)
			}
		}
	}
	var updates []string
	for _, a := range client.Actions() {
		if a.GetVerb() == "update" || a.GetVerb() == "delete" {
			updates = append(updates, a.GetVerb())
		}
	}
	if len(updates) != 0 {
		t.Fatalf("%d updates and deletes in 20 rounds while nothing changed: the publishers contend for one bundle", len(updates))
	}
	content := mustContent(t, roots[0])
	want := states([]*certv1.ClusterTrustBundle{
		bundle(hashedName(content), DefaultSignerName, content, liveLabels(testTD, testTD)),
		bundle(target{signer: DefaultSignerName, peer: peer}.name(content), DefaultSignerName, content, liveLabels(testTD, peer)),
	})
	if diff := cmp.Diff(want, listStates(t, client)); diff != "" {
		t.Fatalf("bundles (-want +got):\n%s", diff)
	}
}

// syncStores makes r's caches hold what the cluster holds.
func syncStores(t *testing.T, client *fake.Clientset, r *run) {
	t.Helper()
	list, err := client.CertificatesV1().ClusterTrustBundles().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	objs := make([]any, len(list.Items))
	for i := range list.Items {
		objs[i] = list.Items[i].DeepCopy()
	}
	for _, store := range r.stores {
		if err := store.Replace(objs, ""); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPeerBundleNames: a peer's bundle is named apart from ours and from
// another peer's holding the same roots, and is no preview.
func TestPeerBundleNames(t *testing.T) {
	content := mustContent(t, testca.RootCerts(t, 1)...)
	east := target{signer: DefaultSignerName, peer: spiffeid.RequireTrustDomainFromString("east.example")}.name(content)
	west := target{signer: DefaultSignerName, peer: spiffeid.RequireTrustDomainFromString("west_1.example")}.name(content)
	ours := hashedName(content)
	if east == ours || west == ours || east == west {
		t.Fatalf("names collide: ours %s, east %s, west %s", ours, east, west)
	}
	for _, n := range []string{east, west} {
		if !strings.HasPrefix(n, "workload-ca.io:spiffe:peer-") || isPreview(n) {
			t.Errorf("peer bundle name %s", n)
		}
	}
}

// TestReconcileBadPeerLeftOut, for ClusterTrustBundles: a peer serving a
// certificate that is not a CA is left out with its reason (told once),
// not retried as an error; its bundle already published stays, and it is
// published again once its roots pass.
func TestReconcileBadPeerLeftOut(t *testing.T) {
	roots := testca.RootCerts(t, 2)
	peer := spiffeid.RequireTrustDomainFromString("east.example")
	issuer := testca.NewRoot(t, testca.P256)
	now := time.Now()
	leaf := testca.Sign(t, &x509.Certificate{SerialNumber: big.NewInt(3), NotBefore: now, NotAfter: now.Add(time.Hour),
		BasicConstraintsValid: true}, issuer.Cert, testca.NewKey(t, testca.P256).Public(), issuer.Key)
	tgt := target{signer: DefaultSignerName, peer: peer}
	good := bundle(tgt.name(mustContent(t, roots[0])), DefaultSignerName, mustContent(t, roots[0]), liveLabels(testTD, peer))
	rs := &testca.Roots{}
	rs.Set(roots[0], leaf)
	var told [][]rootset.LeftOut
	client, r := newTestRun(t, Config{PeerTrustDomain: peer, LeftOut: func(l []rootset.LeftOut) { told = append(told, l) },
		Options: trust.Options{Roots: rs.Get}}, good)
	for range 2 {
		res, err := r.reconcile(context.Background(), DefaultSignerName)
		if err != nil || res != trust.ResultSkipped {
			t.Fatalf("reconcile = %q, %v; want skipped, no error", res, err)
		}
	}
	if diff := cmp.Diff(states([]*certv1.ClusterTrustBundle{good}), listStates(t, client)); diff != "" {
		t.Fatalf("bundles (-want +got):\n%s", diff)
	}
	if len(told) != 1 || len(told[0]) != 1 || told[0][0].Reason != rootset.ReasonInvalid || told[0][0].TrustDomain != peer {
		t.Fatalf("LeftOut told %v, want once: %s invalid", told, peer)
	}
	rs.Set(roots[1])
	if res, err := r.reconcile(context.Background(), DefaultSignerName); err != nil || res != trust.ResultCreated {
		t.Fatalf("reconcile = %q, %v; want the fixed roots created", res, err)
	}
	if len(told) != 2 || told[1] != nil {
		t.Fatalf("LeftOut told %v, want nil once the roots pass", told)
	}
}
