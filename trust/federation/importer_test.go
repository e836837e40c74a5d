package federation

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testwait"
)

// TestImportAfterAStalledFetchTakesTheNextGoodBundle: a peer that hangs
// mid-body fails that fetch at its timeout, and the good bundle it serves
// next is taken at the first retry, one back-off later.
func TestImportAfterAStalledFetchTakesTheNextGoodBundle(t *testing.T) {
	root := testca.NewRoot(t, testca.P256).Cert
	good := bundleJSON(t, root)
	var requests atomic.Int32
	_, p := hostilePeer(t, func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			w.Header().Set("Content-Length", strconv.Itoa(len(good)))
			_, _ = w.Write(good[:len(good)/2])
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		_, _ = w.Write(good)
	})
	p.FetchTimeout = 300 * time.Millisecond
	clk := clocktesting.NewFakeClock(time.Now())
	got := &ztunnelRoots{}
	im, err := NewImporter(ImporterConfig{Peers: []Peer{p}, ZtunnelRoots: got.set, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	testwait.Run(t, im.Run)
	testwait.Eventually(t, "the stalled fetch fails and its retry waits", func() bool {
		return im.States()[0].FetchErrors == 1 && clk.HasWaiters()
	})
	if got.has(root) {
		t.Fatal("half a bundle was taken")
	}
	clk.Step(minRetry)
	testwait.Eventually(t, "the good bundle is taken at the first retry", func() bool { return got.has(root) })
	if n := requests.Load(); n != 2 {
		t.Errorf("%d requests, want the stalled one and one retry", n)
	}
}

// TestImportOneBadPeerLeavesTheOthersIntact: each hostile bundle a peer
// may serve after a good one (too many roots, a non-CA certificate, a CA
// without keyCertSign, our own root, a 20 MiB body, a redirect) is
// refused and counted; that peer keeps its last good bundle, and the
// other peer's roots and the ztunnel roots stay as they were.
func TestImportOneBadPeerLeavesTheOthersIntact(t *testing.T) {
	own := testca.NewRoot(t, testca.P256).Cert
	goodRoot, otherRoot := testca.NewRoot(t, testca.P256).Cert, testca.NewRoot(t, testca.P256).Cert
	noCertSign := testca.NewRoot(t, testca.P256, func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature }).Cert
	huge := append([]byte("{"), make([]byte, 20<<20)...)
	var mu sync.Mutex
	serve := bundleJSON(t, goodRoot)
	var redirect bool
	_, bad := hostilePeer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		body, re := serve, redirect
		mu.Unlock()
		if re {
			http.Redirect(w, r, "http://127.0.0.1:1/", http.StatusFound)
			return
		}
		_, _ = w.Write(body)
	})
	_, other := hostilePeer(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(bundleJSON(t, otherRoot)) })
	other.TrustDomain = west
	clk := clocktesting.NewFakeClock(time.Now())
	got := &ztunnelRoots{}
	im, err := NewImporter(ImporterConfig{Peers: []Peer{bad, other}, ZtunnelRoots: got.set, Clock: clk,
		OwnRoots: func() []*x509.Certificate { return []*x509.Certificate{own} }})
	if err != nil {
		t.Fatal(err)
	}
	testwait.Run(t, im.Run)
	testwait.Eventually(t, "both peers' roots held", func() bool { return got.has(goodRoot) && got.has(otherRoot) })

	for name, body := range map[string][]byte{
		"too many roots":           bundleJSON(t, testca.RootCerts(t, DefaultMaxRoots+1)...),
		"a non-CA certificate":     bundleJSON(t, goodRoot, nonCA(t)),
		"a CA without keyCertSign": bundleJSON(t, noCertSign),
		"our own root":             bundleJSON(t, goodRoot, own),
		"a 20 MiB body":            huge,
		"a redirect":               nil,
	} {
		t.Run(name, func(t *testing.T) {
			mu.Lock()
			serve, redirect = body, body == nil
			mu.Unlock()
			errs := im.States()[0].FetchErrors
			testwait.Eventually(t, "the hostile bundle fetched and refused", func() bool {
				clk.Step(bad.RefreshInterval)
				return im.States()[0].FetchErrors > errs
			})
			s := im.States()
			if s[0].Roots != 1 || s[1].Roots != 1 || s[1].FetchErrors != 0 {
				t.Errorf("states %+v; want one root each and no error of the other peer", s)
			}
			if r := im.Roots(theirs); len(r) != 1 || !r[0].Equal(goodRoot) {
				t.Errorf("the hostile peer's roots: %d, want its last good one", len(r))
			}
			got.mu.Lock()
			n := len(got.roots)
			got.mu.Unlock()
			if n != 2 || !got.has(goodRoot) || !got.has(otherRoot) || got.has(own) {
				t.Errorf("ztunnel roots: %d, want the two peers' good roots only", n)
			}
		})
	}
}

// TestImportRefusesABadBundleFile: a bundle file (the bootstrap of an
// https_spiffe endpoint, or the bundle itself) is checked like a fetched
// bundle: at start, and on every re-read, where a bad one keeps the last
// good bundle.
func TestImportRefusesABadBundleFile(t *testing.T) {
	own, good := testca.NewRoot(t, testca.P256).Cert, testca.NewRoot(t, testca.P256).Cert
	ownRoots := func() []*x509.Certificate { return []*x509.Certificate{own} }
	for name, cert := range map[string]*x509.Certificate{"a non-CA certificate": nonCA(t), "our own root": own} {
		t.Run("at start, "+name, func(t *testing.T) {
			_, err := NewImporter(ImporterConfig{OwnRoots: ownRoots,
				Peers: []Peer{{TrustDomain: theirs, BundleFile: testca.WritePEM(t, cert), RefreshInterval: time.Minute}}})
			if !errors.Is(err, ErrBundleRefused) {
				t.Errorf("NewImporter: %v, want the bundle file refused", err)
			}
		})
	}
	t.Run("on a re-read", func(t *testing.T) {
		path := testca.WritePEM(t, good)
		clk := clocktesting.NewFakeClock(time.Now())
		im, err := NewImporter(ImporterConfig{OwnRoots: ownRoots, Clock: clk,
			Peers: []Peer{{TrustDomain: theirs, BundleFile: path, RefreshInterval: time.Minute}}})
		if err != nil {
			t.Fatal(err)
		}
		testwait.Run(t, im.Run)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: own.Raw}), 0o600); err != nil {
			t.Fatal(err)
		}
		testwait.Eventually(t, "the re-read refused", func() bool {
			clk.Step(time.Minute)
			return im.States()[0].FetchErrors > 0
		})
		if r := im.Roots(theirs); len(r) != 1 || !r[0].Equal(good) {
			t.Errorf("after a bad re-read: %d roots held, want the last good one", len(r))
		}
	})
}
