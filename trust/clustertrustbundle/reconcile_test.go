package clustertrustbundle

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testobs"
	"github.com/workload-ca/workload-ca/internal/testwait"
	"github.com/workload-ca/workload-ca/trust"
)

// state is what the tests compare of a bundle.
type state struct {
	Name, Signer, Content string
	Labels                map[string]string
}

func stateOf(b *certv1.ClusterTrustBundle) state {
	return state{b.Name, b.Spec.SignerName, b.Spec.TrustBundle, b.Labels}
}

// TestReconcile runs reconcile against the fake clientset, with the
// informer stores filled by hand, and compares the bundles left behind and
// the writes made, in order.
func TestReconcile(t *testing.T) {
	roots := testca.RootCerts(t, 3)
	cur := mustContent(t, roots[0], roots[1])
	old := mustContent(t, roots[0])
	other := mustContent(t, roots[2])
	ours := liveLabels(testTD, testTD)
	otherTD := map[string]string{LabelManagedBy: ManagedBy, LabelTrustDomain: "other.org"}
	want := bundle(hashedName(cur), DefaultSignerName, cur, ours)
	wantIstio := bundle(IstioBundleName, IstioSignerName, cur, ours)
	manual := bundle("workload-ca.io:spiffe:manual", DefaultSignerName, other, nil)
	foreignTD := bundle(hashedName(old), DefaultSignerName, old, otherTD)
	otherSigner := bundle("example.com:other:x", "example.com/other", other, ours)

	tests := []struct {
		name     string
		istio    bool
		noRoots  bool
		existing []*certv1.ClusterTrustBundle
		want     []*certv1.ClusterTrustBundle
		writes   []string // verbs, in order
		result   string   // of the last reconcile
		wantErr  error
	}{
		{name: "absent: created", want: []*certv1.ClusterTrustBundle{want},
			writes: []string{"create"}, result: trust.ResultCreated},
		{name: "already right: no write", existing: []*certv1.ClusterTrustBundle{want},
			want: []*certv1.ClusterTrustBundle{want}, result: trust.ResultUnchanged},
		{name: "trustBundle edited: repaired",
			existing: []*certv1.ClusterTrustBundle{bundle(want.Name, DefaultSignerName, other, ours)},
			want:     []*certv1.ClusterTrustBundle{want}, writes: []string{"update"}, result: trust.ResultUpdated},
		{name: "labels edited: ours restored, others kept",
			existing: []*certv1.ClusterTrustBundle{bundle(want.Name, DefaultSignerName, cur,
				map[string]string{"team": "x", LabelTrustDomain: "evil.org"})},
			want: []*certv1.ClusterTrustBundle{bundle(want.Name, DefaultSignerName, cur,
				merged(map[string]string{"team": "x"}, liveLabels(testTD, testTD)))},
			writes: []string{"update"}, result: trust.ResultUpdated},
		{name: "stale owned bundle: deleted after the new one is created",
			existing: []*certv1.ClusterTrustBundle{bundle(hashedName(old), DefaultSignerName, old, ours)},
			want:     []*certv1.ClusterTrustBundle{want}, writes: []string{"create", "delete"}, result: trust.ResultCreated},
		{name: "unowned, other trust domain, other signer: untouched",
			existing: []*certv1.ClusterTrustBundle{manual, foreignTD, otherSigner},
			want:     []*certv1.ClusterTrustBundle{manual, foreignTD, otherSigner, want},
			writes:   []string{"create"}, result: trust.ResultCreated},
		{name: "no roots: error, nothing deleted", noRoots: true,
			existing: []*certv1.ClusterTrustBundle{want}, want: []*certv1.ClusterTrustBundle{want},
			result: trust.ResultError, wantErr: ErrInvalidRoots},
		{name: "istio: both published", istio: true,
			want:   []*certv1.ClusterTrustBundle{wantIstio, want},
			writes: []string{"create", "create"}, result: trust.ResultCreated},
		{name: "istio: fixed name adopted and updated in place, stale istio bundle deleted", istio: true,
			existing: []*certv1.ClusterTrustBundle{want,
				bundle(IstioBundleName, IstioSignerName, old, nil),
				bundle("istio.io:istiod-ca:old", IstioSignerName, old, ours)},
			want:   []*certv1.ClusterTrustBundle{wantIstio, want},
			writes: []string{"update", "delete"}, result: trust.ResultUpdated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs := &testca.Roots{}
			if !tc.noRoots {
				rs.Set(roots[1], roots[0], roots[1]) // unordered, with a duplicate
			}
			client, r := newTestRun(t, Config{IstioCompatible: tc.istio, Options: trust.Options{Roots: rs.Get}}, tc.existing...)
			var result string
			var err error
			for _, signer := range []string{DefaultSignerName, IstioSignerName} {
				if _, ok := r.p.targets[signer]; ok {
					result, err = r.reconcile(context.Background(), signer)
				}
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("reconcile error = %v, want %v", err, tc.wantErr)
			}
			if result != tc.result {
				t.Errorf("result = %q, want %q", result, tc.result)
			}
			if diff := cmp.Diff(states(tc.want), listStates(t, client)); diff != "" {
				t.Errorf("bundles (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.writes, testobs.WriteVerbs(client)); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReconcilePeerBundle publishes a federated trust domain's roots for
// our workloads beside our own bundle: labelled with the peer, our own
// bundle (of the same signer) left alone, a stale peer bundle deleted.
func TestReconcilePeerBundle(t *testing.T) {
	roots := testca.RootCerts(t, 3)
	peer := spiffeid.RequireTrustDomainFromString("east.example")
	own := bundle(hashedName(mustContent(t, roots[0])), DefaultSignerName, mustContent(t, roots[0]), liveLabels(testTD, testTD))
	stale := bundle(hashedName(mustContent(t, roots[1])), DefaultSignerName, mustContent(t, roots[1]), liveLabels(testTD, peer))
	rs := &testca.Roots{}
	rs.Set(roots[2])
	client, r := newTestRun(t, Config{PeerTrustDomain: peer, Options: trust.Options{Roots: rs.Get}}, own, stale)
	if _, err := r.reconcile(context.Background(), DefaultSignerName); err != nil {
		t.Fatal(err)
	}
	want := bundle(target{signer: DefaultSignerName, peer: peer}.name(mustContent(t, roots[2])), DefaultSignerName, mustContent(t, roots[2]), liveLabels(testTD, peer))
	if diff := cmp.Diff(states([]*certv1.ClusterTrustBundle{own, want}), listStates(t, client)); diff != "" {
		t.Errorf("bundles (-want +got):\n%s", diff)
	}
	if got := want.Labels; got[LabelTrustDomain] != "east.example" || got[LabelSPIFFEPeerTD] != "east.example" ||
		got[LabelSPIFFEWorkloadTD] != testTD.Name() || got[LabelSPIFFECanarying] != CanaryingLive {
		t.Errorf("peer bundle labels %v", got)
	}
	if _, err := New(Config{Client: client, PeerTrustDomain: peer, IstioCompatible: true,
		Options: trust.Options{TrustDomain: testTD, Roots: rs.Get}}); err == nil {
		t.Error("a peer publisher with IstioCompatible was accepted")
	}
}

// newTestRun returns a run over a fake clientset holding existing, with the
// informer stores filled by hand (no informer runs).
func newTestRun(t *testing.T, cfg Config, existing ...*certv1.ClusterTrustBundle) (*fake.Clientset, *run) {
	t.Helper()
	objs := make([]runtime.Object, len(existing))
	for i, b := range existing {
		objs[i] = b.DeepCopy()
	}
	client := fake.NewClientset(objs...)
	cfg.Client, cfg.TrustDomain = client, testTD
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := newRun(p, v1API(client))
	for _, store := range r.stores {
		for _, b := range existing {
			if err := store.Add(b.DeepCopy()); err != nil {
				t.Fatal(err)
			}
		}
	}
	client.ClearActions()
	return client, r
}

func states(bs []*certv1.ClusterTrustBundle) []state {
	out := make([]state, len(bs))
	for i, b := range bs {
		out[i] = stateOf(b)
	}
	slices.SortFunc(out, func(a, b state) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func listStates(t *testing.T, client *fake.Clientset) []state {
	t.Helper()
	list, err := client.CertificatesV1().ClusterTrustBundles().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bs := make([]*certv1.ClusterTrustBundle, len(list.Items))
	for i := range list.Items {
		bs[i] = &list.Items[i]
	}
	return states(bs)
}

// TestReconcileDeleteUsesPreconditions checks that a stale bundle is
// deleted only in the version the cache holds.
func TestReconcileDeleteUsesPreconditions(t *testing.T) {
	roots := testca.RootCerts(t, 2)
	stale := bundle(hashedName(mustContent(t, roots[0])), DefaultSignerName, mustContent(t, roots[0]), liveLabels(testTD, testTD))
	stale.UID, stale.ResourceVersion = "uid-1", "7"
	rs := &testca.Roots{}
	rs.Set(roots[1])
	client, r := newTestRun(t, Config{Options: trust.Options{Roots: rs.Get}}, stale)
	if _, err := r.reconcile(context.Background(), DefaultSignerName); err != nil {
		t.Fatal(err)
	}
	for _, a := range client.Actions() {
		if a.GetVerb() != "delete" {
			continue
		}
		opts := a.(interface{ GetDeleteOptions() metav1.DeleteOptions }).GetDeleteOptions()
		if p := opts.Preconditions; p == nil || *p.UID != "uid-1" || *p.ResourceVersion != "7" {
			t.Errorf("delete preconditions = %+v, want UID uid-1 and resourceVersion 7", p)
		}
		return
	}
	t.Fatal("no delete")
}

// TestReconcileRootsReordered checks that the same roots in another order
// (or with duplicates) name the same bundle: nothing is written.
func TestReconcileRootsReordered(t *testing.T) {
	roots := testca.RootCerts(t, 2)
	rs := &testca.Roots{}
	rs.Set(roots[0], roots[1])
	client, r := newTestRun(t, Config{Options: trust.Options{Roots: rs.Get}},
		bundle(hashedName(mustContent(t, roots...)), DefaultSignerName, mustContent(t, roots...), liveLabels(testTD, testTD)))
	rs.Set(roots[1], roots[0], roots[0])
	result, err := r.reconcile(context.Background(), DefaultSignerName)
	if err != nil || result != trust.ResultUnchanged || len(testobs.WriteVerbs(client)) != 0 {
		t.Fatalf("reconcile = %q, %v with writes %v; want unchanged, no writes", result, err, testobs.WriteVerbs(client))
	}
}

// TestReconcileCacheLagThenDeleted: the informer has not seen the bundle
// yet, so the create fails with AlreadyExists, and by the time the live
// object is read someone has deleted it: it is created again, no error.
func TestReconcileCacheLagThenDeleted(t *testing.T) {
	roots := testca.RootCerts(t, 1)
	content := mustContent(t, roots[0])
	name := hashedName(content)
	rs := &testca.Roots{}
	rs.Set(roots[0])
	client, r := newTestRun(t, Config{Options: trust.Options{Roots: rs.Get}})
	if err := client.Tracker().Add(bundle(name, DefaultSignerName, content, liveLabels(testTD, testTD))); err != nil {
		t.Fatal(err)
	}
	deleted := false
	client.PrependReactor("get", "clustertrustbundles", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !deleted {
			deleted = true
			if err := client.Tracker().Delete(certv1.SchemeGroupVersion.WithResource("clustertrustbundles"), "", name); err != nil {
				t.Error(err)
			}
		}
		return false, nil, nil
	})
	result, err := r.reconcile(context.Background(), DefaultSignerName)
	if err != nil || result != trust.ResultCreated {
		t.Fatalf("reconcile = %q, %v; want %q", result, err, trust.ResultCreated)
	}
	if diff := cmp.Diff([]string{"create", "create"}, testobs.WriteVerbs(client)); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	want := []state{{name, DefaultSignerName, content, liveLabels(testTD, testTD)}}
	if diff := cmp.Diff(want, listStates(t, client)); diff != "" {
		t.Errorf("bundles (-want +got):\n%s", diff)
	}
}

// TestReconcileCacheLag: the bundle exists but the informer has not seen
// it yet. The create fails with AlreadyExists and the live object is used.
func TestReconcileCacheLag(t *testing.T) {
	roots := testca.RootCerts(t, 2)
	content := mustContent(t, roots[0])
	name := hashedName(content)
	for _, tc := range []struct {
		name, live string
		result     string
		writes     []string
	}{
		{"live copy right", content, trust.ResultUnchanged, []string{"create"}},
		{"live copy edited", mustContent(t, roots[1]), trust.ResultUpdated, []string{"create", "update"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := &testca.Roots{}
			rs.Set(roots[0])
			client, r := newTestRun(t, Config{Options: trust.Options{Roots: rs.Get}})
			if err := client.Tracker().Add(bundle(name, DefaultSignerName, tc.live, liveLabels(testTD, testTD))); err != nil {
				t.Fatal(err)
			}
			result, err := r.reconcile(context.Background(), DefaultSignerName)
			if err != nil || result != tc.result {
				t.Fatalf("reconcile = %q, %v; want %q", result, err, tc.result)
			}
			if diff := cmp.Diff(tc.writes, testobs.WriteVerbs(client)); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
			want := []state{{name, DefaultSignerName, content, liveLabels(testTD, testTD)}}
			if diff := cmp.Diff(want, listStates(t, client)); diff != "" {
				t.Errorf("bundles (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReconcileContested: another writer (istiod's own publisher, say)
// keeps putting its roots into the Istio-compatible bundle. The first
// change is repaired at once and the writer named; a second one within
// the repair interval waits for the interval to end.
func TestReconcileContested(t *testing.T) {
	roots := testca.RootCerts(t, 3)
	rs := &testca.Roots{}
	rs.Set(roots[0])
	ours, theirs := mustContent(t, roots[0]), mustContent(t, roots[1])
	clk := testingclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	var logs bytes.Buffer
	client, r := newTestRun(t, Config{IstioCompatible: true, Options: trust.Options{Roots: rs.Get, Clock: clk, RepairInterval: time.Minute, Logger: slog.New(slog.NewTextHandler(&logs, nil))}},
		bundle(IstioBundleName, IstioSignerName, ours, liveLabels(testTD, testTD)))
	ctx := context.Background()
	bundles := client.CertificatesV1().ClusterTrustBundles()
	reconcile := func(want string) {
		t.Helper()
		if result, err := r.reconcile(ctx, IstioSignerName); err != nil || result != want {
			t.Fatalf("reconcile = %q, %v; want %q", result, err, want)
		}
	}
	// sync puts the live bundle in the cache, as the informer would.
	sync := func() {
		t.Helper()
		b, err := bundles.Get(ctx, IstioBundleName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.stores[IstioSignerName].Update(b); err != nil {
			t.Fatal(err)
		}
	}
	// rival writes its roots as the field manager istiod's has.
	rival := func() {
		t.Helper()
		b, err := bundles.Get(ctx, IstioBundleName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b.Spec.TrustBundle = theirs
		if _, err := bundles.Update(ctx, b, metav1.UpdateOptions{FieldManager: "pilot-discovery"}); err != nil {
			t.Fatal(err)
		}
		sync()
	}
	holds := func(want string) {
		t.Helper()
		b, err := bundles.Get(ctx, IstioBundleName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if b.Spec.TrustBundle != want {
			t.Fatal("the bundle holds the wrong roots")
		}
	}

	reconcile(trust.ResultUnchanged)
	rival()
	reconcile(trust.ResultRepaired)
	holds(ours)
	if !strings.Contains(logs.String(), "another writer changed the roots in the ClusterTrustBundle") || !strings.Contains(logs.String(), "pilot-discovery") {
		t.Fatalf("the repair was not logged with the other writer:\n%s", logs.String())
	}

	clk.Step(10 * time.Second)
	rival()
	reconcile(trust.ResultDeferred)
	holds(theirs)
	clk.Step(50 * time.Second)
	testwait.Eventually(t, "signer re-queued after the interval", func() bool { return r.queue.Len() == 1 })
	reconcile(trust.ResultRepaired)
	holds(ours)

	// Our own change of roots is not someone else's edit.
	sync()
	rs.Set(roots[2])
	reconcile(trust.ResultUpdated)

	// A new leader has no history, but the stamp its predecessor left says
	// what was written: another writer's edit is still repaired, and a
	// change of our own roots is still an update.
	leader := func() *run {
		t.Helper()
		next := newRun(r.p, v1API(client))
		b, err := bundles.Get(ctx, IstioBundleName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := next.stores[IstioSignerName].Add(b); err != nil {
			t.Fatal(err)
		}
		return next
	}
	rival()
	if result, err := leader().reconcile(ctx, IstioSignerName); err != nil || result != trust.ResultRepaired {
		t.Fatalf("new leader, another writer's roots: reconcile = %q, %v; want %q", result, err, trust.ResultRepaired)
	}
	holds(mustContent(t, roots[2]))
	rs.Set(roots[0])
	if result, err := leader().reconcile(ctx, IstioSignerName); err != nil || result != trust.ResultUpdated {
		t.Fatalf("new leader, our roots changed: reconcile = %q, %v; want %q", result, err, trust.ResultUpdated)
	}
	holds(ours)
}

// TestReconcilePreview: with a preview stage, a root in preview is only in
// the preview bundle; once live it is in both, and the old live bundle is
// gone. The IstioCompatible bundle follows the live roots.
func TestReconcilePreview(t *testing.T) {
	roots := testca.RootCerts(t, 2)
	old, next := roots[0], roots[1]
	rs := &testca.Roots{}
	rs.Set(old, next)
	var preview []*x509.Certificate
	cfg := Config{IstioCompatible: true, Preview: func() []*x509.Certificate { return preview },
		Options: trust.Options{Roots: rs.Get}}
	tgt := target{signer: DefaultSignerName}
	live, all := mustContent(t, old), mustContent(t, old, next)
	previewLabels := merged(ownLabels(testTD, testTD), map[string]string{LabelSPIFFECanarying: CanaryingPreview})
	reconcileAll := func(t *testing.T, existing ...*certv1.ClusterTrustBundle) []state {
		t.Helper()
		client, r := newTestRun(t, cfg, existing...)
		for _, s := range []string{DefaultSignerName, IstioSignerName} {
			if _, err := r.reconcile(context.Background(), s); err != nil {
				t.Fatal(err)
			}
		}
		return listStates(t, client)
	}

	preview = []*x509.Certificate{next}
	got := reconcileAll(t)
	want := states([]*certv1.ClusterTrustBundle{
		bundle(hashedName(live), DefaultSignerName, live, liveLabels(testTD, testTD)),
		bundle(tgt.previewName(all), DefaultSignerName, all, previewLabels),
		bundle(IstioBundleName, IstioSignerName, live, liveLabels(testTD, testTD)),
	})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("in preview (-want +got):\n%s", diff)
	}

	preview = nil
	existing := []*certv1.ClusterTrustBundle{
		bundle(hashedName(live), DefaultSignerName, live, liveLabels(testTD, testTD)),
		bundle(tgt.previewName(all), DefaultSignerName, all, previewLabels),
	}
	got = reconcileAll(t, existing...)
	want = states([]*certv1.ClusterTrustBundle{
		bundle(hashedName(all), DefaultSignerName, all, liveLabels(testTD, testTD)),
		bundle(tgt.previewName(all), DefaultSignerName, all, previewLabels),
		bundle(IstioBundleName, IstioSignerName, all, liveLabels(testTD, testTD)),
	})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("live (-want +got):\n%s", diff)
	}
}
