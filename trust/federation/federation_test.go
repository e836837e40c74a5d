package federation

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testwait"
)

var (
	ours   = spiffeid.RequireTrustDomainFromString("cluster.local")
	theirs = spiffeid.RequireTrustDomainFromString("east.example")
	west   = spiffeid.RequireTrustDomainFromString("west.example")
)

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	bundle := testca.WritePEM(t, testca.NewRoot(t, testca.P256).Cert)
	for name, tc := range map[string]struct {
		yaml    string
		wantErr string // empty: valid
	}{
		"an https_spiffe endpoint and two peers": {yaml: `
endpoint: {address: "127.0.0.1:8443", profile: https_spiffe, refreshHint: 1m}
trustDomains:
- {trustDomain: east.example, url: "https://east.example/bundle", profile: https_spiffe, endpointSPIFFEID: "spiffe://east.example/spire/server", bundleFile: ` + bundle + `, ztunnel: true}
- {trustDomain: west.example, bundleFile: ` + bundle + `}`},
		"a bundle file that is not there": {yaml: `trustDomains: [{trustDomain: a.example, bundleFile: /no/such/file}]`, wantErr: "bundleFile"},
		"web certificate files not there": {yaml: `endpoint: {address: ":8443", profile: https_web, certFile: /no/c, keyFile: /no/k}`, wantErr: "endpoint certificate"},
		"nothing":                         {yaml: `{}`, wantErr: "neither an endpoint nor a trust domain"},
		"unknown field":                   {yaml: `endpoint: {address: ":1", profile: https_spiffe, port: 3}`, wantErr: "unknown field"},
		"web endpoint without files":      {yaml: `endpoint: {address: ":1", profile: https_web}`, wantErr: "needs certFile and keyFile"},
		"bad endpoint profile":            {yaml: `endpoint: {address: ":1", profile: http}`, wantErr: "endpoint.profile"},
		"endpoint ID of another trust domain": {yaml: `endpoint: {address: ":1", profile: https_spiffe, spiffeID: "spiffe://east.example/x"}`,
			wantErr: "not in our trust domain"},
		"our own trust domain":     {yaml: `trustDomains: [{trustDomain: cluster.local, bundleFile: /b}]`, wantErr: "our own trust domain"},
		"a trust domain twice":     {yaml: `trustDomains: [{trustDomain: a.example, bundleFile: /b}, {trustDomain: a.example, bundleFile: /c}]`, wantErr: "listed twice"},
		"no source":                {yaml: `trustDomains: [{trustDomain: a.example}]`, wantErr: "needs a url"},
		"http url":                 {yaml: `trustDomains: [{trustDomain: a.example, url: "http://a", profile: https_web}]`, wantErr: "want an https:// URL"},
		"spiffe without bootstrap": {yaml: `trustDomains: [{trustDomain: a.example, url: "https://a", profile: https_spiffe, endpointSPIFFEID: "spiffe://a.example/s"}]`, wantErr: "needs a bundleFile"},
		"spiffe without endpoint ID": {yaml: `trustDomains: [{trustDomain: a.example, url: "https://a", profile: https_spiffe, bundleFile: /b}]`,
			wantErr: "endpointSPIFFEID"},
		"endpoint ID outside its trust domain": {yaml: `trustDomains: [{trustDomain: a.example, url: "https://a", profile: https_spiffe, endpointSPIFFEID: "spiffe://b.example/s", bundleFile: /b}]`,
			wantErr: "is not in trust domain a.example"},
		"from another signer's ClusterTrustBundles": {yaml: `trustDomains: [{trustDomain: a.example, fromClusterTrustBundles: {signerName: a.example/ca, matchLabels: {x: y}}, ztunnel: true}]`},
		"ClusterTrustBundles and a url":             {yaml: `trustDomains: [{trustDomain: a.example, url: "https://a", profile: https_web, fromClusterTrustBundles: {signerName: a.example/ca}}]`, wantErr: "instead of url and bundleFile"},
		"ClusterTrustBundles of a bad signer name":  {yaml: `trustDomains: [{trustDomain: a.example, fromClusterTrustBundles: {signerName: ca}}]`, wantErr: "signerName"},
		"refresh under a second":                    {yaml: `trustDomains: [{trustDomain: a.example, bundleFile: /b, refreshInterval: 10ms}]`, wantErr: "refreshInterval"},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(path, ours)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Load: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Load: %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

// TestSequenceGrowsThroughARotation: a newer root added, then the old
// one removed, each raise the sequence number.
func TestSequenceGrowsThroughARotation(t *testing.T) {
	now := time.Now()
	old := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(time.Hour))).Cert
	next := testca.NewRoot(t, testca.P256, testca.Validity(now, now.Add(2*time.Hour))).Cert
	steady, prepared, retired := Sequence([]*x509.Certificate{old}), Sequence([]*x509.Certificate{old, next}), Sequence([]*x509.Certificate{next})
	if steady >= prepared || prepared >= retired {
		t.Errorf("sequence %d → %d → %d, want it rising", steady, prepared, retired)
	}
}

// peerCA is a CA of theirs serving its bundle at an endpoint of profile.
type peerCA struct {
	auth  *ca.Authority
	roots *testca.Roots
	addr  string
	stop  func()
}

func startPeer(t *testing.T, profile string, hint time.Duration) *peerCA {
	t.Helper()
	root := testca.NewRoot(t, testca.P256)
	auth, err := ca.New(ca.Config{TrustDomain: theirs}, root.Material())
	if err != nil {
		t.Fatal(err)
	}
	p := &peerCA{auth: auth, roots: &testca.Roots{}}
	p.roots.Set(root.Cert)
	key := testca.NewKey(t, testca.P256)
	var leaf *x509.Certificate
	if profile == ProfileSPIFFE {
		leaf, _, err = auth.IssueServingSVID(t.Context(), key.Public(), spiffeid.RequireFromSegments(theirs, "bundle"), time.Hour)
	} else {
		leaf, _, err = auth.IssueServing(t.Context(), key.Public(), []string{"localhost"}, time.Hour)
	}
	if err != nil {
		t.Fatal(err)
	}
	cert := &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(ServerConfig{TrustDomain: theirs, Roots: p.roots.Get, RefreshHint: hint, Listener: lis,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert, nil }})
	if err != nil {
		t.Fatal(err)
	}
	p.addr = lis.Addr().String()
	p.stop = testwait.Run(t, s.Run)
	return p
}

// ztunnelRoots records what the importer last gave the authority.
type ztunnelRoots struct {
	mu    sync.Mutex
	roots []*x509.Certificate
}

func (z *ztunnelRoots) set(r []*x509.Certificate) { z.mu.Lock(); z.roots = r; z.mu.Unlock() }
func (z *ztunnelRoots) has(c *x509.Certificate) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	for _, r := range z.roots {
		if r.Equal(c) {
			return true
		}
	}
	return false
}

// TestImportFollowsTheEndpoint imports a peer over each profile: the
// peer's roots reach ZtunnelRoots, a new root of the peer follows at the
// refresh hint, and while the endpoint is down the last bundle is kept and
// the failures are counted.
func TestImportFollowsTheEndpoint(t *testing.T) {
	for _, profile := range []string{ProfileSPIFFE, ProfileWeb} {
		t.Run(profile, func(t *testing.T) {
			peer := startPeer(t, profile, time.Second)
			first := peer.roots.Get()[0]
			cfg := Peer{TrustDomain: theirs, URL: "https://" + peer.addr + "/", Profile: profile,
				RefreshInterval: 2 * time.Second, Ztunnel: true}
			if profile == ProfileSPIFFE {
				cfg.EndpointSPIFFEID = spiffeid.RequireFromSegments(theirs, "bundle")
				cfg.BundleFile = testca.WritePEM(t, first)
			} else {
				cfg.URL = "https://localhost:" + strings.Split(peer.addr, ":")[1] + "/"
				cfg.WebRootsFile = testca.WritePEM(t, first)
			}
			got := &ztunnelRoots{}
			im, err := NewImporter(ImporterConfig{Peers: []Peer{cfg}, ZtunnelRoots: got.set})
			if err != nil {
				t.Fatal(err)
			}
			testwait.Run(t, im.Run)

			testwait.Eventually(t, "the peer's root reaches the ztunnel roots", func() bool {
				return got.has(first) && !im.States()[0].LastSuccess.IsZero()
			})
			next := testca.NewRoot(t, testca.P256).Cert
			peer.roots.Set(first, next)
			testwait.Eventually(t, "the peer's new root follows", func() bool { return got.has(next) })
			if b, ok := im.Bundle(theirs); !ok || len(b.X509Authorities()) != 2 {
				t.Fatalf("bundle held: %v", b)
			}

			peer.stop()
			testwait.Eventually(t, "a failed refresh is counted", func() bool { return im.States()[0].FetchErrors > 0 })
			if s := im.States()[0]; s.Roots != 2 || !got.has(first) || !got.has(next) {
				t.Errorf("after the endpoint went down: %+v; want the last bundle (2 roots) kept", s)
			}
		})
	}
}

// TestImportWithoutZtunnelKeepsTheAnswer: a peer imported without ztunnel
// is held, and never reaches the ztunnel roots.
func TestImportWithoutZtunnelKeepsTheAnswer(t *testing.T) {
	root := testca.NewRoot(t, testca.P256).Cert
	got := &ztunnelRoots{}
	im, err := NewImporter(ImporterConfig{Peers: []Peer{{TrustDomain: theirs, BundleFile: testca.WritePEM(t, root), RefreshInterval: time.Minute}},
		ZtunnelRoots: got.set})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := im.Bundle(theirs); !ok || got.has(root) {
		t.Errorf("held %v, in the ztunnel roots %v; want held only", ok, got.has(root))
	}
}

// TestImportFromClusterTrustBundles: a peer whose roots are another
// signer's ClusterTrustBundles is read at once, re-read on its interval
// (a failure keeps the bundle held), and needs the reader.
func TestImportFromClusterTrustBundles(t *testing.T) {
	first, second := testca.NewRoot(t, testca.P256).Cert, testca.NewRoot(t, testca.P256).Cert
	sel := &BundleSelectorFile{SignerName: "a.example/ca", MatchLabels: map[string]string{"x": "y"}}
	peer := Peer{TrustDomain: theirs, FromBundles: sel, RefreshInterval: time.Second, Ztunnel: true}
	if _, err := NewImporter(ImporterConfig{Peers: []Peer{peer}}); err == nil {
		t.Fatal("NewImporter without a ClusterTrustBundles reader: no error")
	}
	var mu sync.Mutex
	roots, fail := []*x509.Certificate{first}, false
	got := &ztunnelRoots{}
	im, err := NewImporter(ImporterConfig{Peers: []Peer{peer}, ZtunnelRoots: got.set,
		ClusterTrustBundles: func(_ context.Context, s BundleSelectorFile) ([]*x509.Certificate, error) {
			mu.Lock()
			defer mu.Unlock()
			if s.SignerName != sel.SignerName || s.MatchLabels["x"] != "y" {
				t.Errorf("asked for %+v, want %+v", s, *sel)
			}
			if fail {
				return nil, errors.New("apiserver down")
			}
			return roots, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	testwait.Run(t, im.Run)
	testwait.Eventually(t, "the first roots held", func() bool { return got.has(first) })
	mu.Lock()
	fail = true
	mu.Unlock()
	testwait.Eventually(t, "a failed read counted", func() bool { return im.States()[0].FetchErrors > 0 })
	if !got.has(first) {
		t.Error("a failed read dropped the bundle held")
	}
	mu.Lock()
	roots, fail = []*x509.Certificate{second}, false
	mu.Unlock()
	testwait.Eventually(t, "the second roots replace the first", func() bool { return got.has(second) && !got.has(first) })
}
