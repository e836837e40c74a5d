package e2e_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/e2e/internal/proc"
	"github.com/workload-ca/workload-ca/e2e/internal/spireserver"
	"github.com/workload-ca/workload-ca/trust/clustertrustbundle"
)

// spireWait bounds each wait for one side to act on the other's bundle:
// our CA refreshes SPIRE's every 2s, SPIRE is told to fetch ours at once.
const spireWait = 30 * time.Second

// TestSPIREFederation federates a CA (cluster.local) with a real SPIRE
// server (spire.example, built from its module by make spire), both ways
// over https_spiffe on loopback, each bootstrapped out of band with the
// other's bundle as the SPIFFE federation specification describes: the CA
// from `spire-server bundle show -format spiffe` in its bundleFile, SPIRE
// by `spire-server bundle set` with our roots. Each then fetches the
// other's bundle from its endpoint, and an X509-SVID of each verifies with
// the bundle the other holds of its trust domain.
func TestSPIREFederation(t *testing.T) {
	t.Parallel()
	bin := toolBinary(t, "spire-server", spireserver.EnvBinary)
	f := newLCFixture(t, "spire")
	ours := spiffeid.RequireTrustDomainFromString("cluster.local")
	theirs := spiffeid.RequireTrustDomainFromString("spire.example")
	ourEndpointID := spiffeid.RequireFromPath(ours, "/workload-ca/bundle-endpoint")
	ports, err := proc.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	ourAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	ourURL := "https://" + ourAddr + "/"

	spire, err := spireserver.Start(t.Context(), spireserver.Options{Binary: bin, Dir: filepath.Join(f.dir, "spire"),
		TrustDomain: theirs, RefreshHint: time.Minute,
		FederatesWith: []spireserver.Peer{{TrustDomain: ours, URL: ourURL, EndpointSPIFFEID: ourEndpointID}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("spire-server log %s; last output:\n%s", spire.LogPath(), lastLines(spire.Tail(), 15))
		}
		if err := spire.Stop(); err != nil {
			t.Errorf("stop spire-server: %v", err)
		}
	})
	doc, err := spire.Command(t.Context(), "bundle", "show", "-format", "spiffe")
	if err != nil {
		t.Fatal(err)
	}
	spireFirst, err := spiffebundle.Parse(theirs, doc)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bootstrap := filepath.Join(dir, "spire-bundle.json")
	config := filepath.Join(dir, "federation.yaml")
	if err := os.WriteFile(bootstrap, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, fmt.Appendf(nil, `
endpoint: {address: %q, profile: https_spiffe, refreshHint: 1s}
trustDomains:
- trustDomain: %s
  url: https://%s/
  profile: https_spiffe
  endpointSPIFFEID: %s
  bundleFile: %q
  refreshInterval: 2s
  ztunnel: true
  clusterTrustBundle: true
`, ourAddr, theirs.Name(), spire.BundleEndpoint, spire.EndpointSPIFFEID(), bootstrap), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := f.start(t, "--federation-config", config)
	token := f.ztunnels(t, 1)[0]
	ourID := spiffeid.RequireFromPath(ours, "/ns/demo/sa/web")
	// ask returns the chain (leaf first) and roots of an answer to our
	// ztunnel.
	ask := func(t *testing.T) ([]*x509.Certificate, []*x509.Certificate) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		res, err := requestErr(ctx, ca, token, ourID.String())
		if err != nil {
			t.Fatalf("ask %s for %s: %v", ca.Addr(), ourID, err)
		}
		return append([]*x509.Certificate{res.Leaf}, res.Chain...), res.Roots
	}
	// importedRoots are the roots of spire.example our CA publishes as its
	// ClusterTrustBundle: what a SPIFFE-aware workload verifies SPIRE's
	// SVIDs with.
	importedRoots := func(t *testing.T) ([]*x509.Certificate, error) {
		sel := clustertrustbundle.LabelSPIFFEPeerTD + "=" + theirs.Name() + "," + clustertrustbundle.LabelSPIFFECanarying + "=live"
		l, err := f.s.cp.Client().CertificatesV1().ClusterTrustBundles().List(t.Context(),
			metav1.ListOptions{LabelSelector: sel, FieldSelector: "spec.signerName=" + f.signer})
		if err != nil || len(l.Items) != 1 {
			return nil, err
		}
		return parsePEMCerts(t, l.Items[0].Spec.TrustBundle), nil
	}

	t.Run("SPIRE fetches our bundle from our endpoint after its bootstrap", func(t *testing.T) {
		roots := ownRoots(t, ca)
		if err := spire.SetFederatedBundle(t.Context(), spiffebundle.FromX509Authorities(ours, roots)); err != nil {
			t.Fatal(err)
		}
		// Our bundle as our endpoint serves it, fetched as SPIRE does.
		// `federation refresh` fails unless SPIRE fetched our bundle from
		// our endpoint and authenticated its SVID with the bootstrap.
		// (SPIRE v1.13.3 does not show the sequence number it fetched, so
		// the fetch is not told apart from the bootstrap by content.)
		var served, held *spiffebundle.Bundle
		var lastErr error
		err := pollUntil(t, spireWait, func() (bool, error) {
			// SPIRE retries a relationship it could not authenticate a
			// minute later; this fetches now (and fails until our
			// endpoint serves).
			if lastErr = spire.RefreshFederatedBundle(t.Context(), ours); lastErr != nil {
				return false, nil
			}
			if served, lastErr = federation.FetchBundle(t.Context(), ours, ourURL,
				federation.WithSPIFFEAuth(spiffebundle.FromX509Authorities(ours, roots), ourEndpointID)); lastErr != nil {
				return false, nil
			}
			if held, lastErr = spire.FederatedBundle(t.Context(), ours); lastErr != nil {
				return false, nil
			}
			return held.X509Bundle().Equal(served.X509Bundle()), nil
		})
		if err != nil {
			t.Fatalf("SPIRE never held the bundle our endpoint serves (held %v, served %v; last error %v): %v",
				describe(held), describe(served), lastErr, err)
		}
		if got := held.X509Authorities(); !sameCerts(got, roots) {
			t.Errorf("SPIRE holds %d roots of %s, our Secret %d", len(got), ours, len(roots))
		}
	})
	t.Run("we import SPIRE's bundle into our answer and a ClusterTrustBundle", func(t *testing.T) {
		want := spireFirst.X509Authorities()
		var ctb []*x509.Certificate
		if err := pollUntil(t, spireWait, func() (bool, error) {
			var err error
			ctb, err = importedRoots(t)
			return sameCerts(ctb, want), err
		}); err != nil {
			t.Fatalf("no ClusterTrustBundle of %s holding SPIRE's %d roots (has %d): %v", theirs, len(want), len(ctb), err)
		}
		if _, roots := ask(t); !slices.ContainsFunc(want, func(c *x509.Certificate) bool { return holds(roots, c) }) {
			t.Errorf("our answer's %d roots hold none of SPIRE's", len(roots))
		}
	})
	t.Run("an SVID SPIRE mints verifies with the bundle we imported", func(t *testing.T) {
		checkSPIRESVID(t, spire, theirs, importedRoots, ask)
	})
	t.Run("an SVID of ours verifies with the bundle SPIRE holds of us", func(t *testing.T) {
		chain, _ := ask(t)
		held, err := spire.FederatedBundle(t.Context(), ours)
		if err != nil {
			t.Fatal(err)
		}
		id, _, err := x509svid.Verify(chain, held)
		if err != nil {
			t.Fatalf("our SVID does not verify with SPIRE's bundle of %s: %v", ours, err)
		}
		if id != ourID {
			t.Errorf("verified as %s, want %s", id, ourID)
		}
	})
	t.Run("SPIRE's next authority reaches us from its endpoint before it signs with it", func(t *testing.T) {
		began := time.Now()
		authority, err := spire.PrepareX509Authority(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		next, err := spire.Bundle(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		fresh := slices.DeleteFunc(next.X509Authorities(), func(c *x509.Certificate) bool { return holds(spireFirst.X509Authorities(), c) })
		if len(fresh) != 1 {
			t.Fatalf("SPIRE's bundle has %d new roots after prepare, want 1", len(fresh))
		}
		if err := pollUntil(t, spireWait, func() (bool, error) {
			ctb, err := importedRoots(t)
			_, roots := ask(t)
			return holds(ctb, fresh[0]) && holds(roots, fresh[0]), err
		}); err != nil {
			t.Fatalf("SPIRE's prepared root never reached our ClusterTrustBundle and answer: %v", err)
		}
		t.Logf("SPIRE's prepared root in our ClusterTrustBundle and answer %v after prepare", time.Since(began).Round(time.Millisecond))
		if err := spire.ActivateX509Authority(t.Context(), authority); err != nil {
			t.Fatal(err)
		}
		leaf := checkSPIRESVID(t, spire, theirs, importedRoots, ask)
		if leaf != nil && leaf.CheckSignatureFrom(fresh[0]) != nil {
			t.Error("SPIRE's SVID after activate is not signed by the prepared root")
		}
	})
}

// checkSPIRESVID mints an SVID with spire and verifies it with the roots
// of td we publish (SPIFFE-aware: bound to td) and with our ztunnels'
// answer (ask); it returns the leaf.
func checkSPIRESVID(t *testing.T, spire *spireserver.Server, td spiffeid.TrustDomain,
	importedRoots func(*testing.T) ([]*x509.Certificate, error), ask func(*testing.T) ([]*x509.Certificate, []*x509.Certificate)) *x509.Certificate {
	t.Helper()
	want := spiffeid.RequireFromPath(td, "/workload/db")
	chain, err := spire.MintX509SVID(t.Context(), want, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := importedRoots(t)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(td, roots))
	if err != nil {
		t.Errorf("SPIRE's SVID does not verify with our ClusterTrustBundle of %s: %v", td, err)
	} else if id != want {
		t.Errorf("verified as %s, want %s", id, want)
	}
	_, answer := ask(t)
	opts := x509.VerifyOptions{Roots: certPool(answer), Intermediates: certPool(chain[1:]), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
	if _, err := chain[0].Verify(opts); err != nil {
		t.Errorf("SPIRE's SVID does not verify with the roots our ztunnels receive: %v", err)
	}
	return chain[0]
}

// describe summarizes b for a failure message.
func describe(b *spiffebundle.Bundle) string {
	if b == nil {
		return "none"
	}
	seq, ok := b.SequenceNumber()
	if !ok {
		return fmt.Sprintf("%d roots, no sequence number", len(b.X509Authorities()))
	}
	return fmt.Sprintf("%d roots, sequence %d", len(b.X509Authorities()), seq)
}
