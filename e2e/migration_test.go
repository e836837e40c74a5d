package e2e_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/e2e/cahost"
)

// TestMigrationFromIstiod runs docs/migrating-from-istiod.md against the
// real istiod: ztunnels (node agents asking for the identities of pods on
// their node, as ztunnel does) get certificates from istiod's own CA;
// workload-ca starts with istiod's root as its plug-in root; the ztunnels
// move to it one at a time (CA_ADDRESS), one moves back (the rollback
// step) and forward again; istiod's CA is retired last. Not one request
// fails, and every leaf, from either CA, verifies against the one root
// bundle of the mesh, istiod's root, at the moment it was issued.
func TestMigrationFromIstiod(t *testing.T) {
	bin := toolBinary(t, "pilot-discovery", envIstiod)
	f := newLCFixture(t, "migrate")
	cp := f.s.cp
	for _, sa := range []string{"ztunnel", "web", "api"} {
		if _, err := cp.CreateServiceAccount(t.Context(), f.ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	var tokens []string
	for i := range 2 {
		pod := f.s.createPod(t, f.ns, fmt.Sprintf("ztunnel-%d", i), "ztunnel", "node-a")
		tok, err := f.s.mintFor(t.Context(), pod, audience, 3600)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, tok)
	}
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	var ids []spiffeid.ID
	for _, sa := range []string{"web", "api"} {
		f.s.createPod(t, f.ns, sa+"-0", sa, "node-a")
		ids = append(ids, spiffeid.RequireFromSegments(td, "ns", f.ns, "sa", sa))
	}

	// istiod with its own CA, trusting the ztunnels as node agents.
	d := startIstiod(t, bin, cp.KubeconfigPath(), f.ns, filepath.Join(f.dir, "istiod"),
		"CA_TRUSTED_NODE_ACCOUNTS="+f.ns+"/ztunnel")
	secret, err := cp.Client().CoreV1().Secrets(f.ns).Get(t.Context(), "istio-ca-secret", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("istiod's CA Secret: %v", err)
	}
	meshRoots, err := pemCerts(secret.Data["ca-cert.pem"])
	if err != nil || len(meshRoots) != 1 {
		t.Fatalf("istiod's root: %v (%d certificates)", err, len(meshRoots))
	}
	istiodCA := caEndpoint{name: "istiod", addr: d.xdsAddr, serverName: "istiod." + f.ns + ".svc"}

	load := startMigrationLoad(tokens, ids, meshRoots, istiodCA)
	defer load.stop()
	load.waitIssued(t, "istiod", 10)

	// 1. workload-ca with istiod's root as its plug-in root.
	rootDir := filepath.Join(f.dir, "root")
	if err := os.MkdirAll(rootDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{keystore.IstioRootFile: secret.Data["ca-cert.pem"], keystore.IstioRootKeyFile: secret.Data["ca-key.pem"]} {
		if err := os.WriteFile(filepath.Join(rootDir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ca := f.start(t, "--ca-root-dir", rootDir, "--node-agents", f.ns+"/ztunnel")
	theLeader(t, []*cahost.CA{ca})
	ours := caEndpoint{name: "workload-ca", addr: ca.Addr(), serverName: cahost.ServerName}

	// 2. The ztunnels move one at a time; one rolls back and forward.
	load.point(0, ours)
	load.waitIssued(t, "workload-ca", 10)
	load.point(1, ours)
	load.waitIssuedBy(t, 1, "workload-ca", 5)
	load.point(1, istiodCA) // rollback
	load.waitIssuedBy(t, 1, "istiod", 5)
	load.point(1, ours)
	load.waitIssuedBy(t, 1, "workload-ca", 5)

	// 3. istiod's CA retired.
	if err := d.p.Kill(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	n := load.count("workload-ca")
	load.waitIssued(t, "workload-ca", n+10)

	issued, failures := load.stop()
	for _, f := range failures {
		t.Error(f)
	}
	by := map[string]int{}
	for _, is := range issued {
		by[is.from]++
		if err := verifiesWith(is.res.Leaf, is.res.Chain, meshRoots, is.at); err != nil {
			t.Errorf("a leaf from %s at %s does not verify against the mesh's root: %v", is.from, is.at.Format(time.StampMilli), err)
		}
		if !sameCerts(is.res.Roots, meshRoots) {
			t.Errorf("%s answered with roots %s, want istiod's root alone", is.from, subjects(is.res.Roots))
		}
	}
	t.Logf("%d certificates (%v), %d failed requests", len(issued), by, len(failures))
}

// caEndpoint is a CA a simulated ztunnel asks.
type caEndpoint struct{ name, addr, serverName string }

type migrationIssue struct {
	from    string
	ztunnel int
	at      time.Time
	res     *caclient.Result
}

// migrationLoad is ztunnels asking, every 50ms, for the identities of the
// pods on their node, each from the CA it points at now.
type migrationLoad struct {
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	targets  []atomic.Pointer[caEndpoint]
	mu       sync.Mutex
	issued   []migrationIssue
	failures []string
}

func startMigrationLoad(tokens []string, ids []spiffeid.ID, roots []*x509.Certificate, first caEndpoint) *migrationLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &migrationLoad{cancel: cancel, targets: make([]atomic.Pointer[caEndpoint], len(tokens))}
	for z, token := range tokens {
		l.targets[z].Store(&first)
		l.wg.Go(func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for k := 0; ; k++ {
				l.request(ctx, z, token, ids[k%len(ids)], roots)
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	return l
}

func (l *migrationLoad) request(ctx context.Context, z int, token string, id spiffeid.ID, roots []*x509.Certificate) {
	target := l.targets[z].Load()
	fail := func(err error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.failures = append(l.failures, fmt.Sprintf("%s ztunnel %d → %s, %s: %v", time.Now().Format(time.StampMilli), z, target.name, id, err))
	}
	res, at, err := askAsZtunnel(ctx, target.addr, target.serverName, token, id, roots)
	if ctx.Err() != nil {
		return // stopped: not a failure of the CA
	}
	if err != nil {
		fail(err)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.issued = append(l.issued, migrationIssue{from: target.name, ztunnel: z, at: at, res: res})
}

// point moves ztunnel z to e, as a changed CA_ADDRESS and a restart do.
func (l *migrationLoad) point(z int, e caEndpoint) { l.targets[z].Store(&e) }

func (l *migrationLoad) countBy(z int, from string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, is := range l.issued {
		if is.from == from && (z < 0 || is.ztunnel == z) {
			n++
		}
	}
	return n
}

func (l *migrationLoad) count(from string) int { return l.countBy(-1, from) }

func (l *migrationLoad) waitIssued(t *testing.T, from string, n int) {
	t.Helper()
	l.waitIssuedBy(t, -1, from, n)
}

// waitIssuedBy waits until ztunnel z has n more certificates from from
// than when called; with z -1, until all ztunnels together have n.
func (l *migrationLoad) waitIssuedBy(t *testing.T, z int, from string, n int) {
	t.Helper()
	start := 0
	if z >= 0 {
		start = l.countBy(z, from)
	}
	if err := pollUntil(t, lcWait, func() (bool, error) { return l.countBy(z, from)-start >= n, nil }); err != nil {
		l.mu.Lock()
		failures := l.failures
		l.mu.Unlock()
		t.Fatalf("ztunnel %d: %d certificates from %s, want %d more: %v; failures: %q", z, l.countBy(z, from), from, n, err, failures)
	}
}

// stop stops the ztunnels and returns what they got.
func (l *migrationLoad) stop() ([]migrationIssue, []string) {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.issued, l.failures
}
