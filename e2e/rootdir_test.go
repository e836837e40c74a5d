package e2e_test

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

// TestLifecyclePluginRootReload runs the CA on intermediates of a plug-in
// root (--ca-secret with --ca-root-dir) whose directory is updated the way
// the kubelet updates a Secret volume. A new signing root that keeps the
// old one in the bundle is taken without a restart: the published bundle
// and the answers' root bundle hold both roots, and certificates keep
// verifying. Once the new root has been in the bundle for the propagation
// delay, and not before, leaves come from an intermediate of the new
// root. A bundle that drops the root of an intermediate still in the
// Secret is refused and logged, and nothing changes.
func TestLifecyclePluginRootReload(t *testing.T) {
	f := newLCFixture(t, "rootdir")
	old, next := testca.NewRoot(t, testca.P256), testca.NewRoot(t, testca.P256)
	vol := &volumeDir{dir: filepath.Join(f.dir, "root")}
	vol.write(t, rootDirFiles(t, old))
	const propagation = 3 * time.Second
	ca := f.start(t, "--ca-root-dir", vol.dir, "--ca-dir-poll-interval", "200ms",
		"--rotation-propagation-delay", propagation.String())
	pid := ca.Pid()

	bundle := func(roots ...*x509.Certificate) (name, content string) {
		t.Helper()
		content, err := rootset.PEM(roots)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(content))
		return strings.ReplaceAll(f.signer, "/", ":") + ":" + hex.EncodeToString(sum[:8]), content
	}
	// Clients trust the published bundle, not the directory (which may
	// already lack a root the CA still needs).
	issuedUnder := func(roots ...*x509.Certificate) *caclient.Result {
		t.Helper()
		pool := x509.NewCertPool()
		for _, r := range roots {
			pool.AddCert(r)
		}
		client, err := caclient.Dial(caclient.Config{Address: ca.Addr(), Roots: pool, ServerName: cahost.ServerName})
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		res, err := client.CreateCertificate(ctx, caclient.Request{Token: f.s.ztunnelA,
			Identity: spiffeid.RequireFromString(id("demo", "web")), Impersonate: true})
		if err != nil {
			t.Fatalf("request: %v", err)
		}
		if len(res.Roots) != len(roots) {
			t.Errorf("the answer's root bundle has %d roots, want %d", len(res.Roots), len(roots))
		}
		if err := verifiesWith(res.Leaf, res.Chain, roots, time.Now()); err != nil {
			t.Errorf("leaf does not verify: %v", err)
		}
		return res
	}
	// signedBy reports whether an intermediate of root signed res's leaf.
	signedBy := func(res *caclient.Result, root *x509.Certificate) bool {
		return len(res.Chain) == 1 && res.Chain[0].CheckSignatureFrom(root) == nil
	}
	name, content := bundle(old.Cert)
	waitBundle(t, f, name, f.signer, content)
	issuedUnder(old.Cert)

	var changed time.Time
	t.Run("a new signing root beside the old one is taken", func(t *testing.T) {
		changed = time.Now()
		vol.write(t, rootDirFiles(t, next, old))
		name, content := bundle(old.Cert, next.Cert)
		waitBundle(t, f, name, f.signer, content)
		issuedUnder(old.Cert, next.Cert)
	})
	t.Run("the new root signs after the propagation delay", func(t *testing.T) {
		var moved time.Time
		err := pollUntil(t, lcWait, func() (bool, error) {
			res := issuedUnder(old.Cert, next.Cert)
			switch {
			case signedBy(res, next.Cert):
				moved = time.Now()
				return true, nil
			case !signedBy(res, old.Cert):
				return false, errors.New("a leaf from an intermediate of neither root")
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("no leaf from an intermediate of the new root: %v", err)
		}
		// The CA cannot have seen the new root before it was written.
		if d := moved.Sub(changed); d < propagation {
			t.Errorf("the new root signed %v after it was written, before the %v propagation delay", d, propagation)
		}
		if len(logLines(ca, "new plug-in signing root", "trusted_from")) == 0 {
			t.Error("the move to the new root was not announced in the log")
		}
	})
	// The old root's intermediate is retiring now, still in the Secret.
	t.Run("a bundle without the in-use root is refused", func(t *testing.T) {
		vol.write(t, rootDirFiles(t, next))
		waitLogLines(t, ca, "refused changed CA material", "does not fit")
		issuedUnder(old.Cert, next.Cert)
	})
	if ca.Exited() || ca.Pid() != pid {
		t.Errorf("the CA restarted (pid %d, was %d; exited %v)", ca.Pid(), pid, ca.Exited())
	}
}

// TestLifecyclePluginRootFailover: the leader sees a new signing root in
// --ca-root-dir and records when in the CA Secret; a second replica starts
// seconds later and takes over when the leader stops. The new leader
// counts the propagation delay from the recorded sighting, not from its
// own later one: both log the same trusted_from, and leaves move to the
// new root's intermediate no sooner than the delay after the root was
// written, and well before the delay after the new leader started.
func TestLifecyclePluginRootFailover(t *testing.T) {
	f := newLCFixture(t, "rootfail")
	old, next := testca.NewRoot(t, testca.P256), testca.NewRoot(t, testca.P256)
	vol := &volumeDir{dir: filepath.Join(f.dir, "root")}
	vol.write(t, rootDirFiles(t, old))
	const (
		propagation = 12 * time.Second
		lateStart   = 5 * time.Second // the second replica's sightings come this much later
	)
	args := []string{"--ca-root-dir", vol.dir, "--ca-dir-poll-interval", "200ms", "--rotation-propagation-delay", propagation.String(),
		"--leader-election-lease-duration", "4s", "--leader-election-renew-deadline", "3s", "--leader-election-retry-period", "500ms"}
	first := f.start(t, args...)
	theLeader(t, []*cahost.CA{first})
	recorded := func(ca *cahost.CA, roots int) (trustedFrom string) {
		t.Helper()
		err := pollUntil(t, lcWait, func() (bool, error) {
			for _, line := range logLines(ca, "plug-in roots recorded", fmt.Sprintf(`"roots":%d`, roots)) {
				var rec struct {
					TrustedFrom string `json:"trusted_from"`
				}
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					return false, err
				}
				trustedFrom = rec.TrustedFrom
			}
			return trustedFrom != "", nil
		})
		if err != nil {
			t.Fatalf("no record of %d plug-in roots logged: %v", roots, err)
		}
		return trustedFrom
	}
	recorded(first, 1)

	changed := time.Now()
	vol.write(t, rootDirFiles(t, next, old))
	want := recorded(first, 2)
	time.Sleep(time.Until(changed.Add(lateStart)))
	second, err := f.startReplica(t.Context(), "", true, args...)
	if err != nil {
		t.Fatal(err)
	}
	f.stopAtCleanup(t, second)
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	theLeader(t, []*cahost.CA{second})
	if got := recorded(second, 2); got != want {
		t.Errorf("the new leader's root is trusted from %s, want %s: the first leader's record", got, want)
	}

	var moved time.Time
	err = pollUntil(t, 2*propagation, func() (bool, error) {
		res := requestFrom(t, second, f.s.ztunnelA, id("demo", "web"))
		if len(res.Chain) == 1 && res.Chain[0].CheckSignatureFrom(next.Cert) == nil {
			moved = time.Now()
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no leaf from an intermediate of the new root: %v", err)
	}
	switch d := moved.Sub(changed); {
	case d < propagation:
		t.Errorf("the new root signed %v after it was written, before the %v propagation delay", d, propagation)
	case d >= propagation+lateStart-time.Second:
		t.Errorf("the new root signed %v after it was written: the new leader counted the delay from its own start", d)
	}
}

// rootDirFiles returns a plug-in root directory: signing's certificate
// first in root-cert.pem, then the other roots, and signing's key.
func rootDirFiles(t *testing.T, signing *testca.CA, others ...*testca.CA) map[string][]byte {
	t.Helper()
	certs := signing.CertPEM()
	for _, o := range others {
		certs = append(certs, o.CertPEM()...)
	}
	return map[string][]byte{
		keystore.IstioRootFile:    certs,
		keystore.IstioRootKeyFile: signing.KeyPEM(t),
	}
}
