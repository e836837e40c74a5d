package configmap

import (
	"context"
	"crypto/x509"
	"log/slog"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testlog"
	"github.com/workload-ca/workload-ca/trust"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

var (
	peerA = spiffeid.RequireTrustDomainFromString("a.example")
	peerB = spiffeid.RequireTrustDomainFromString("b.example")
)

// leftOutLog records what LeftOut was told.
type leftOutLog struct {
	mu    sync.Mutex
	calls [][]rootset.LeftOut
}

func (l *leftOutLog) record(left []rootset.LeftOut) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, left)
}

// reasons is what the last call said, by trust domain.
func (l *leftOutLog) reasons() map[spiffeid.TrustDomain]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[spiffeid.TrustDomain]string{}
	if len(l.calls) > 0 {
		for _, x := range l.calls[len(l.calls)-1] {
			out[x.TrustDomain] = x.Reason
		}
	}
	return out
}

// constrainedRoot is a peer root that may vouch only for DNS names under
// domain.
func constrainedRoot(t *testing.T, domain string) *x509.Certificate {
	return testca.NewRoot(t, testca.P256, func(c *x509.Certificate) { c.PermittedDNSDomains = []string{domain} }).Cert
}

// TestReconcileBadPeerKeepsOurRoots: a peer whose
// bundle holds a certificate that is not a CA, or more than the budget,
// used to make every reconcile fail, so istio-ca-root-cert stopped
// following even our own next root. Now that peer is left out (logged
// once, reported to LeftOut) and our roots and the good peer's go in.
func TestReconcileBadPeerKeepsOurRoots(t *testing.T) {
	ours := testca.RootCerts(t, 2)
	good := constrainedRoot(t, "a.example")
	issuer := testca.NewRoot(t, testca.P256)
	now := time.Now()
	leaf := testca.Sign(t, &x509.Certificate{SerialNumber: big.NewInt(9), NotBefore: now, NotAfter: now.Add(time.Hour),
		BasicConstraintsValid: true}, issuer.Cert, testca.NewKey(t, testca.P256).Public(), issuer.Key)
	huge := make([]*x509.Certificate, 0, ContentBudget/len(good.Raw)+1)
	for len(huge) < cap(huge) {
		huge = append(huge, constrainedRoot(t, "b.example"))
	}
	for _, tc := range []struct {
		name   string
		bad    []*x509.Certificate
		reason string
	}{
		{"a non-CA certificate", []*x509.Certificate{constrainedRoot(t, "b.example"), leaf}, rootset.ReasonInvalid},
		{"over the size budget", huge, rootset.ReasonOverBudget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := &testca.Roots{}
			rs.Set(ours[0])
			peers := func() []rootset.Peer {
				return []rootset.Peer{{TrustDomain: peerB, Roots: tc.bad}, {TrustDomain: peerA, Roots: []*x509.Certificate{good}}}
			}
			var logs testlog.Buffer
			left := &leftOutLog{}
			cfg := Config{Peers: peers, LeftOut: left.record,
				Options: trust.Options{Roots: rs.Get, Logger: slog.New(slog.NewTextHandler(&logs, nil))}}
			client, r := newTestRun(t, cfg, namespace("app", nil), nil, nil, nil)
			for _, ns := range []string{"app", "other"} {
				if err := r.namespaces.Add(namespace(ns, nil)); err != nil {
					t.Fatal(err)
				}
			}
			rs.Set(ours...) // our next root arrives
			for _, ns := range []string{"app", "other", "app"} {
				if res, err := r.reconcile(context.Background(), ns); err != nil || res == trust.ResultError {
					t.Fatalf("reconcile %s = %q, %v; want our roots published", ns, res, err)
				}
			}
			want := mustContent(t, ours[0], ours[1], good)
			for _, ns := range []string{"app", "other"} {
				if got := rootsIn(client, ns); got != want {
					t.Fatalf("%s holds %d bytes, want ours and the good peer's roots", ns, len(got))
				}
			}
			if got := left.reasons(); len(got) != 1 || got[peerB] != tc.reason || len(left.calls) != 1 {
				t.Fatalf("LeftOut told %v in %d calls, want once {%s: %s}", got, len(left.calls), peerB, tc.reason)
			}
			if n := strings.Count(logs.String(), "leaving a federated trust domain's roots out"); n != 1 {
				t.Fatalf("logged the left-out peer %d times, want once:\n%s", n, logs.String())
			}
		})
	}
}

// TestReconcilePeerDNSConstraints: a federated
// root in istio-ca-root-cert also vouches for DNS names, so a peer could
// mint istiod.istio-system.svc. A peer's root goes in only when its name
// constraints keep it off our DNS names; the others are left out with
// their reason, and once they are fixed they go in.
func TestReconcilePeerDNSConstraints(t *testing.T) {
	ours := testca.RootCerts(t, 1)[0]
	uriOnly := testca.NewRoot(t, testca.P256, func(c *x509.Certificate) { c.PermittedURIDomains = []string{"b.example"} }).Cert
	tests := []struct {
		name     string
		root     *x509.Certificate
		ourNames []string
		in       bool
	}{
		{"no name constraints: out", testca.NewRoot(t, testca.P256).Cert, nil, false},
		{"a URI constraint only: out", uriOnly, nil, false},
		{"permits svc: out", constrainedRoot(t, "svc"), nil, false},
		{"permits the cluster domain: out", constrainedRoot(t, "cluster.local"), nil, false},
		{"permits istiod's configured name: out", constrainedRoot(t, "mesh.example"), []string{"istiod.mesh.example"}, false},
		{"permits only its own domain: in", constrainedRoot(t, "b.example"), []string{"istiod.mesh.example"}, true},
		{"excludes every DNS name: in", testca.NewRoot(t, testca.P256, func(c *x509.Certificate) {
			c.PermittedURIDomains, c.ExcludedDNSDomains = []string{"b.example"}, []string{""}
		}).Cert, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs := &testca.Roots{}
			rs.Set(ours)
			left := &leftOutLog{}
			cfg := Config{OurDNSDomains: tc.ourNames, LeftOut: left.record,
				Peers: func() []rootset.Peer {
					return []rootset.Peer{{TrustDomain: peerB, Roots: []*x509.Certificate{tc.root}}}
				},
				Options: trust.Options{Roots: rs.Get, Logger: testlog.New(t)}}
			client, r := newTestRun(t, cfg, namespace("app", nil), nil, nil, nil)
			if _, err := r.reconcile(context.Background(), "app"); err != nil {
				t.Fatal(err)
			}
			want, reason := mustContent(t, ours), rootset.ReasonDNSUnconstrained
			if tc.in {
				want, reason = mustContent(t, ours, tc.root), ""
			}
			if got := rootsIn(client, "app"); got != want {
				t.Fatalf("ConfigMap holds the peer's root: %v, want %v", got != mustContent(t, ours), tc.in)
			}
			if got := left.reasons()[peerB]; got != reason {
				t.Fatalf("left out for %q, want %q", got, reason)
			}
		})
	}
}

// TestReconcilePeerFixedGoesIn: a peer left out goes in once its roots
// pass, and LeftOut is told the list is empty again.
func TestReconcilePeerFixedGoesIn(t *testing.T) {
	ours := testca.RootCerts(t, 1)[0]
	bad, fixed := testca.NewRoot(t, testca.P256).Cert, constrainedRoot(t, "b.example")
	var mu sync.Mutex
	peer := bad
	rs := &testca.Roots{}
	rs.Set(ours)
	left := &leftOutLog{}
	cfg := Config{LeftOut: left.record, Options: trust.Options{Roots: rs.Get, Logger: testlog.New(t)},
		Peers: func() []rootset.Peer {
			mu.Lock()
			defer mu.Unlock()
			return []rootset.Peer{{TrustDomain: peerB, Roots: []*x509.Certificate{peer}}}
		}}
	client, r := newTestRun(t, cfg, namespace("app", nil), nil, nil, nil)
	for i, want := range []string{mustContent(t, ours), mustContent(t, ours, fixed)} {
		if i == 1 {
			mu.Lock()
			peer = fixed
			mu.Unlock()
		}
		if _, err := r.reconcile(context.Background(), "app"); err != nil {
			t.Fatal(err)
		}
		if err := r.configMaps.Add(mustGet(t, client, "app")); err != nil {
			t.Fatal(err)
		}
		if rootsIn(client, "app") != want {
			t.Fatalf("step %d: wrong roots", i)
		}
	}
	if len(left.calls) != 2 || len(left.calls[1]) != 0 {
		t.Fatalf("LeftOut calls %v, want the peer, then none", left.calls)
	}
}

// mustGet reads our ConfigMap in ns.
func mustGet(t *testing.T, c kubernetes.Interface, ns string) *corev1.ConfigMap {
	t.Helper()
	cm, err := c.CoreV1().ConfigMaps(ns).Get(context.Background(), ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}
