package e2e_test

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/internal/proc"
	"github.com/workload-ca/workload-ca/e2e/internal/promserver"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/trust/clustertrustbundle"
)

// TestFederation runs two CAs of different trust domains on the suite's
// API server, each serving its bundle and importing the other's over
// loopback: A (cluster.local) serves https_web with a certificate of a
// "web" CA and imports B over https_spiffe, bootstrapped with B's first
// root, into its ztunnels' answer; B (b.example) serves https_spiffe with
// its own SVID and imports A over https_web, not into its answer. B
// rotates its root on the fast schedule of the lifecycle tests.
func TestFederation(t *testing.T) {
	t.Parallel()
	fa, fb := newLCFixture(t, "fed-a"), newLCFixture(t, "fed-b")
	ports, err := proc.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	addrA, addrB := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}

	web := testca.NewRoot(t, testca.P256)
	webKey := testca.NewKey(t, testca.P256)
	webLeaf := testca.Sign(t, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "bundle endpoint"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, web.Cert, webKey.Public(), web.Key)
	webCert := write("web-cert.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: webLeaf.Raw}))
	webKeyFile := write("web-key.pem", (&testca.CA{Key: webKey}).KeyPEM(t))
	webRoots := write("web-roots.pem", web.CertPEM())

	// B's root: 60s long and 25s old, so B prepares its successor at
	// +5s and signs with it from +25s (5/6).
	began := time.Now()
	oldB := fb.seed(t, began.Add(-25*time.Second), began.Add(35*time.Second))
	bootstrap := write("b-bootstrap.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: oldB.Raw}))
	configA := write("a.yaml", fmt.Appendf(nil, `
endpoint: {address: %q, profile: https_web, certFile: %q, keyFile: %q, refreshHint: 1s}
trustDomains:
- trustDomain: b.example
  url: https://%s/
  profile: https_spiffe
  endpointSPIFFEID: spiffe://b.example/workload-ca/bundle-endpoint
  bundleFile: %q
  refreshInterval: 2s
  ztunnel: true
  clusterTrustBundle: true
`, addrA, webCert, webKeyFile, addrB, bootstrap))
	configB := write("b.yaml", fmt.Appendf(nil, `
endpoint: {address: %q, profile: https_spiffe, refreshHint: 1s}
trustDomains:
- {trustDomain: cluster.local, url: "https://%s/", profile: https_web, webRootsFile: %q, refreshInterval: 2s}
`, addrB, addrA, webRoots))

	caA := fa.start(t, "--federation-config", configA)
	caB := fb.start(t, append(slices.Clone(fastRotation), "--trust-domain", "b.example", "--federation-config", configB)...)
	tokA, tokB := fa.ztunnels(t, 1)[0], fb.ztunnels(t, 1)[0]
	idA := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	idB := spiffeid.RequireFromString("spiffe://b.example/ns/demo/sa/web")
	ask := func(ca *cahost.CA, token string, id spiffeid.ID) *caclient.Result {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		res, err := requestErr(ctx, ca, token, id.String())
		if err != nil {
			t.Fatalf("ask %s for %s: %v", ca.Addr(), id, err)
		}
		return res
	}

	t.Run("a leaf of B verifies with the roots A gives its ztunnels", func(t *testing.T) {
		if err := pollUntil(t, lcWait, func() (bool, error) {
			return holds(ask(caA, tokA, idA).Roots, oldB), nil
		}); err != nil {
			t.Fatalf("B's root never reached A's answer: %v", err)
		}
		leafB := ask(caB, tokB, idB)
		if err := verifyWith(leafB, ask(caA, tokA, idA).Roots); err != nil {
			t.Errorf("B's leaf does not verify with A's answer: %v", err)
		}
	})
	t.Run("without ztunnel, B imports A's bundle but its answer does not carry it", func(t *testing.T) {
		if err := pollUntil(t, lcWait, func() (bool, error) {
			s, err := scrapeCA(t.Context(), caB)
			return err == nil && fedValue(s, "workload_ca_federation_bundle_roots", "cluster.local") >= 1, err
		}); err != nil {
			t.Fatalf("B never held A's bundle (https_web): %v", err)
		}
		leafA := ask(caA, tokA, idA)
		if err := verifyWith(leafA, ask(caB, tokB, idB).Roots); err == nil {
			t.Error("A's leaf verifies with B's answer, which should hold B's own roots only")
		}
	})
	t.Run("A publishes its own and B's roots as ClusterTrustBundles with the SPIFFE labels", func(t *testing.T) {
		bundles := fa.s.cp.Client().CertificatesV1().ClusterTrustBundles()
		for _, want := range []struct{ peer, rootsOf string }{{"cluster.local", "A"}, {"b.example", "B"}} {
			sel := clustertrustbundle.LabelSPIFFEPeerTD + "=" + want.peer + "," + clustertrustbundle.LabelSPIFFEWorkloadTD + "=cluster.local," +
				clustertrustbundle.LabelSPIFFECanarying + "=live," + clustertrustbundle.LabelTrustDomain + "=" + want.peer
			if err := pollUntil(t, lcWait, func() (bool, error) {
				l, err := bundles.List(t.Context(), metav1.ListOptions{LabelSelector: sel, FieldSelector: "spec.signerName=" + fa.signer})
				if err != nil || len(l.Items) != 1 {
					return false, err
				}
				roots := parsePEMCerts(t, l.Items[0].Spec.TrustBundle)
				if want.rootsOf == "B" {
					return holds(roots, oldB), nil
				}
				return len(roots) > 0 && !holds(roots, oldB), nil
			}); err != nil {
				t.Errorf("no bundle of signer %s labelled %s with %s's roots: %v", fa.signer, sel, want.rootsOf, err)
			}
		}
	})
	t.Run("A's ztunnels see B's new root before B signs with it", func(t *testing.T) {
		var seenByA, signedByB time.Time
		var newB *x509.Certificate
		err := pollUntil(t, 45*time.Second, func() (bool, error) {
			now := time.Now()
			rootsA := ask(caA, tokA, idA).Roots
			leafB := ask(caB, tokB, idB)
			for _, r := range rootsA {
				if newB == nil && !r.Equal(oldB) && !holds(ownRoots(t, caA), r) {
					newB, seenByA = r, now
				}
			}
			if top := leafB.Chain; len(top) == 0 && leafB.Leaf.CheckSignatureFrom(oldB) != nil ||
				len(top) > 0 && top[len(top)-1].CheckSignatureFrom(oldB) != nil {
				signedByB = now
				return true, nil
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("B did not start signing with a new root: %v", err)
		}
		switch {
		case newB == nil:
			t.Fatal("A's answer never carried B's new root")
		case !seenByA.Before(signedByB):
			t.Errorf("A's answer carried B's new root at +%v, B signed with it at +%v", seenByA.Sub(began), signedByB.Sub(began))
		default:
			t.Logf("B's new root in A's answer at +%v, B signing with it at +%v (%v before)", seenByA.Sub(began).Round(time.Millisecond),
				signedByB.Sub(began).Round(time.Millisecond), signedByB.Sub(seenByA).Round(time.Millisecond))
		}
		if err := verifyWith(ask(caB, tokB, idB), ask(caA, tokA, idA).Roots); err != nil {
			t.Errorf("B's leaf of the new root does not verify with A's answer: %v", err)
		}
	})
	t.Run("B's endpoint down: A keeps the last bundle and its age rises", func(t *testing.T) {
		before := ask(caA, tokA, idA).Roots
		if err := caB.Stop(); err != nil {
			t.Fatal(err)
		}
		age := func() (float64, float64) {
			s, err := scrapeCA(t.Context(), caA)
			if err != nil {
				t.Fatal(err)
			}
			return fedValue(s, "workload_ca_federation_bundle_age_seconds", "b.example"),
				fedValue(s, "workload_ca_federation_fetch_errors_total", "b.example")
		}
		age0, errs0 := age()
		time.Sleep(5 * time.Second)
		age1, errs1 := age()
		if age1 < age0+4 || errs1 <= errs0 {
			t.Errorf("bundle age %.1fs → %.1fs, fetch errors %.0f → %.0f over 5s; want the age up by about 5s and errors counted", age0, age1, errs0, errs1)
		}
		if after := ask(caA, tokA, idA).Roots; len(after) != len(before) {
			t.Errorf("A's answer holds %d roots after B went down, %d before", len(after), len(before))
		}
		t.Logf("bundle age %.1fs → %.1fs, fetch errors %.0f → %.0f", age0, age1, errs0, errs1)
	})
}

// verifyWith verifies res's leaf through its chain with roots only.
func verifyWith(res *caclient.Result, roots []*x509.Certificate) error {
	opts := x509.VerifyOptions{Roots: certPool(roots), Intermediates: certPool(res.Chain), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
	_, err := res.Leaf.Verify(opts)
	return err
}

func holds(roots []*x509.Certificate, c *x509.Certificate) bool {
	return slices.ContainsFunc(roots, c.Equal)
}

// fedValue is metric name of trust domain td in s (0 when absent).
func fedValue(s promserver.Samples, name, td string) float64 {
	v, _ := s.Sum(name, "trust_domain", td)
	return v
}

// ownRoots are the roots in ca's Secret.
func ownRoots(t *testing.T, ca *cahost.CA) []*x509.Certificate {
	t.Helper()
	b, err := ca.RootsPEM(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return parsePEMCerts(t, string(b))
}

// TestFederationHostilePeer imports, next to a good peer, peers served by
// the test on loopback that turn hostile once the CA runs: a 20 MiB body,
// a connection stalled mid-body (which then serves a good bundle), a
// redirect to plain http, a bundle naming our own root, non-CA
// certificates and too many roots. Our answers carry our root, the good
// peers' roots and nothing else; each hostile peer's failures are counted;
// the ClusterTrustBundles we publish hold no junk; and the CA's resident
// memory grows by less than 64 MiB.
func TestFederationHostilePeer(t *testing.T) {
	t.Parallel()
	f := newLCFixture(t, "fed-hostile")
	var own atomic.Pointer[[]*x509.Certificate] // our roots, once the CA runs
	goodRoot, stallRoot, junkRoot := testca.NewRoot(t, testca.P256).Cert, testca.NewRoot(t, testca.P256).Cert, testca.NewRoot(t, testca.P256).Cert
	var nonCA []*x509.Certificate
	for i := range 3 {
		key := testca.NewKey(t, testca.P256)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(100 + i)), Subject: pkix.Name{CommonName: fmt.Sprintf("junk leaf %d", i)},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageDigitalSignature}
		nonCA = append(nonCA, testca.Sign(t, tmpl, tmpl, key.Public(), key))
	}
	bundle := func(td string, roots ...*x509.Certificate) []byte {
		b := spiffebundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString(td), roots)
		b.SetRefreshHint(time.Second)
		raw, err := b.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	var (
		hostile   atomic.Bool  // off: every hostile path answers 404
		stalls    atomic.Int32 // stalled requests so far
		plainHits atomic.Int32
	)
	const stallCount = 2
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		plainHits.Add(1)
		_, _ = w.Write(bundle("redirect.example", junkRoot))
	}))
	t.Cleanup(plain.Close)
	good, stallBundle := bundle("good.example", goodRoot), bundle("stall.example", stallRoot)
	paths := map[string]func(w http.ResponseWriter, r *http.Request){
		"/good": func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(good) },
		"/big": func(w http.ResponseWriter, _ *http.Request) {
			chunk := []byte("{" + strings.Repeat(" ", 64<<10-1))
			for n := 0; n < 20<<20; n += len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
				chunk[0] = ' '
			}
		},
		"/stall": func(w http.ResponseWriter, r *http.Request) {
			if stalls.Add(1) > stallCount {
				_, _ = w.Write(stallBundle)
				return
			}
			w.Header().Set("Content-Length", strconv.Itoa(len(stallBundle)))
			_, _ = w.Write(stallBundle[:len(stallBundle)/2])
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		},
		"/redirect": func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, plain.URL+"/", http.StatusFound) },
		"/ours": func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write(bundle("ours.example", append([]*x509.Certificate{junkRoot}, *own.Load()...)...))
		},
		"/nonca": func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(bundle("nonca.example", nonCA...)) },
		"/many": func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write(bundle("many.example", testca.RootCerts(t, 40)...))
		},
	}
	peers := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := paths[r.URL.Path]
		if h == nil || r.URL.Path != "/good" && !hostile.Load() {
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}))
	t.Cleanup(peers.Close)
	webRoots := filepath.Join(t.TempDir(), "web-roots.pem")
	if err := os.WriteFile(webRoots, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: peers.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	hostileTDs := []string{"big", "stall", "redirect", "ours", "nonca", "many"}
	config := "trustDomains:\n"
	for _, name := range append([]string{"good"}, hostileTDs...) {
		config += fmt.Sprintf("- {trustDomain: %s.example, url: %q, profile: https_web, webRootsFile: %q, refreshInterval: 2s, fetchTimeout: 1s, ztunnel: true, clusterTrustBundle: true}\n",
			name, peers.URL+"/"+name, webRoots)
	}
	configPath := filepath.Join(t.TempDir(), "federation.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := f.start(t, "--federation-config", configPath)
	tok := f.ztunnels(t, 1)[0]
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	answerRoots := func() []*x509.Certificate {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		res, err := requestErr(ctx, ca, tok, id.String())
		if err != nil {
			t.Fatalf("CSR: %v", err)
		}
		return res.Roots
	}
	// Our roots (the CA's Secret, which may hold a next root) and the
	// good peers' roots.
	allowedRoots := func() []*x509.Certificate { return append(ownRoots(t, ca), goodRoot, stallRoot) }
	checkAnswer := func(when string) {
		t.Helper()
		roots, allowed := answerRoots(), allowedRoots()
		for _, r := range roots {
			if !holds(allowed, r) {
				t.Errorf("%s: the answer carries a root no good peer served: %s", when, r.Subject)
			}
		}
		if len(roots) > len(allowed) {
			t.Errorf("%s: the answer carries %d roots, at most %d expected", when, len(roots), len(allowed))
		}
	}
	if err := pollUntil(t, lcWait, func() (bool, error) { return holds(answerRoots(), goodRoot), nil }); err != nil {
		t.Fatalf("the good peer's root never reached the answer: %v", err)
	}
	checkAnswer("before the peers turned hostile")
	rss0 := residentKiB(t, ca.Pid())

	roots := ownRoots(t, ca)
	own.Store(&roots)
	hostile.Store(true)
	turned := time.Now()
	// Every hostile peer refused several times over, the stalled one
	// (2 stalls of 1s, then good) picked up on a retry.
	errsOf := func() map[string]float64 {
		s, err := scrapeCA(t.Context(), ca)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, name := range hostileTDs {
			out[name] = fedValue(s, "workload_ca_federation_fetch_errors_total", name+".example")
		}
		return out
	}
	base := errsOf()
	var pickedUp time.Duration
	if err := pollUntil(t, 45*time.Second, func() (bool, error) {
		if pickedUp == 0 && holds(answerRoots(), stallRoot) {
			pickedUp = time.Since(turned)
		}
		now := errsOf()
		for _, name := range hostileTDs {
			if name != "stall" && now[name] < base[name]+5 {
				return false, nil
			}
		}
		return pickedUp > 0, nil
	}); err != nil {
		t.Fatalf("hostile peers not refused five times each, or the stalled peer's good bundle not taken (after %v): %v; errors %v → %v",
			pickedUp, err, base, errsOf())
	}
	rss1 := residentKiB(t, ca.Pid())
	checkAnswer("with the peers hostile")
	if n := plainHits.Load(); n != 0 {
		t.Errorf("the redirect to plain http was followed %d times", n)
	}
	// Two stalls of at most 1s each and back-offs of 1s and 2s: the good
	// bundle follows within about 5s.
	if pickedUp > 10*time.Second {
		t.Errorf("the stalled peer's good bundle was taken %v after the stalls began, want within its timeouts and back-off", pickedUp)
	}
	growth := float64(rss1-rss0) / 1024
	if growth >= 64 {
		t.Errorf("the CA's resident memory grew by %.1f MiB (%d → %d KiB), want under 64", growth, rss0, rss1)
	}
	t.Logf("RSS %d → %d KiB (%+.1f MiB); fetch errors %v → %v; stalled peer's bundle taken after %v",
		rss0, rss1, growth, base, errsOf(), pickedUp.Round(time.Millisecond))

	bundles, err := f.s.cp.Client().CertificatesV1().ClusterTrustBundles().List(t.Context(), metav1.ListOptions{FieldSelector: "spec.signerName=" + f.signer})
	if err != nil {
		t.Fatal(err)
	}
	allowed := allowedRoots()
	for _, b := range bundles.Items {
		for _, r := range parsePEMCerts(t, b.Spec.TrustBundle) {
			if !holds(allowed, r) {
				t.Errorf("ClusterTrustBundle %s holds a root no good peer served: %s", b.Name, r.Subject)
			}
		}
	}
}

// residentKiB is the resident set of process pid, from /proc.
func residentKiB(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb
		}
	}
	t.Fatalf("/proc/%d/status: no VmRSS", pid)
	return 0
}
