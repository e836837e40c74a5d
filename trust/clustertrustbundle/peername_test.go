package clustertrustbundle

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testlog"
	"github.com/workload-ca/workload-ca/internal/testobs"
	"github.com/workload-ca/workload-ca/internal/testwait"
	"github.com/workload-ca/workload-ca/trust"
)

// TestPeerBundleEqualToOursDoesNotFlap is issue 37's finding 4: a peer
// serving our own public bundle got the same content-addressed name as
// our bundle under our signer, and the two publishers relabelled that one
// object back and forth (hundreds of updates a second), so pods selecting
// our trust domain intermittently matched nothing. Peer bundles are now
// named apart: both publishers settle with one create each and, over
// repeated full reconciles, no update.
func TestPeerBundleEqualToOursDoesNotFlap(t *testing.T) {
	roots := testca.RootCerts(t, 1)
	peer := spiffeid.RequireTrustDomainFromString("east.example")
	client := fakeCluster(allowAll, "v1")
	fc := testclock.NewFakeClock(time.Now())
	own, theirs := &testobs.Results{}, &testobs.Results{}
	rs := &testca.Roots{}
	rs.Set(roots[0])
	var pubs []*Publisher
	for _, c := range []struct {
		peer spiffeid.TrustDomain
		obs  *testobs.Results
	}{{spiffeid.TrustDomain{}, own}, {peer, theirs}} {
		p, err := New(Config{Client: client, PeerTrustDomain: c.peer, Options: trust.Options{TrustDomain: testTD,
			Roots: rs.Get, Observer: c.obs, Clock: fc, Logger: testlog.New(t)}})
		if err != nil {
			t.Fatal(err)
		}
		startRun(t, p)
		pubs = append(pubs, p)
	}
	testwait.Eventually(t, "both publishers settled", func() bool {
		return own.Count(trust.ResultUnchanged) > 0 && theirs.Count(trust.ResultUnchanged) > 0
	})
	before := len(testobs.WriteVerbs(client))
	for i := 1; i <= 20; i++ {
		for _, p := range pubs {
			p.Trigger()
		}
		u0, u1 := own.Count(trust.ResultUnchanged), theirs.Count(trust.ResultUnchanged)
		testwait.Eventually(t, "a full reconcile of both", func() bool {
			return own.Count(trust.ResultUnchanged) > u0 && theirs.Count(trust.ResultUnchanged) > u1
		})
	}
	if writes := testobs.WriteVerbs(client)[before:]; len(writes) != 0 {
		t.Fatalf("%d writes while nothing changed (%v): the publishers contend for one bundle", len(writes), strings.Join(writes, ","))
	}
	content := mustContent(t, roots[0])
	got := listStates(t, client)
	want := states([]*certv1.ClusterTrustBundle{
		bundle(hashedName(content), DefaultSignerName, content, liveLabels(testTD, testTD)),
		bundle(target{signer: DefaultSignerName, peer: peer}.name(content), DefaultSignerName, content, liveLabels(testTD, peer)),
	})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("bundles (-want +got):\n%s", diff)
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
