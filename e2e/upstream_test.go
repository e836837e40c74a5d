package e2e_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/internal/vaultserver"
)

// startVault starts a Vault server for t, stopped when t ends (its log
// shown if t failed), with the PKI engine set up; it returns the server
// and Vault's root.
func startVault(t *testing.T, dir string) (*vaultserver.Server, *x509.Certificate) {
	t.Helper()
	bin := toolBinary(t, "vault-server", vaultserver.EnvBinary)
	v, err := vaultserver.Start(t.Context(), bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("vault log %s; last lines:\n%s", v.LogPath(), lastLines(v.Tail(), 30))
		}
		if err := v.Stop(); err != nil {
			t.Logf("vault stop: %v", err)
		}
	})
	root, err := v.SetUpPKI(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return v, root
}

// TestVaultUpstream runs the CA with no root of its own on intermediates
// that a real Vault server's PKI engine issues, logging in with Vault's
// Kubernetes auth method as its service account. Leaves verify to Vault's
// root; one rotation of the intermediate runs under load while Vault is
// stopped through the first attempts to prepare it, and is taken once
// Vault is back, with no request failing and the replica ready all along.
func TestVaultUpstream(t *testing.T) {
	f := newLCFixture(t, "vault")
	// Vault reviews login tokens with a reviewer's token, as it is set up
	// outside a cluster; the CA's own token is for Vault's audience only.
	const sa, reviewer = "workload-ca", "vault-reviewer"
	for _, name := range []string{sa, reviewer} {
		if _, err := f.s.cp.CreateServiceAccount(t.Context(), f.ns, name); err != nil {
			t.Fatal(err)
		}
	}
	err := f.s.cp.BindClusterRole(t.Context(), "vault-reviewer-"+f.ns, []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
	}, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: reviewer, Namespace: f.ns})
	if err != nil {
		t.Fatal(err)
	}
	mint := func(name string, audiences ...string) string {
		t.Helper()
		seconds := int64(3600)
		tr, err := f.s.cp.Client().CoreV1().ServiceAccounts(f.ns).CreateToken(t.Context(), name, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	v, vaultRoot := startVault(t, filepath.Join(f.dir, "vault"))
	caPEM, err := os.ReadFile(f.s.cp.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	if err := v.EnableKubernetesAuth(t.Context(), f.s.cp.Host(), caPEM, mint(reviewer), f.ns, sa); err != nil {
		t.Fatal(err)
	}

	// The CA's service-account token, as a projected volume holds it.
	token := mint(sa, "vault")
	tokenFile := filepath.Join(f.dir, "vault-token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	// The CA speaks https only: Vault's API behind a TLS front.
	vaultURL, vaultCA, closeHTTPS, err := v.HTTPS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeHTTPS)
	config := filepath.Join(f.dir, "upstream.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, `vault:
  address: %s
  caFile: %s
  mount: pki
  kubernetes:
    role: workload-ca
    tokenFile: %s
nameConstraints: true
timeout: 3s
readyMargin: 10s
`, vaultURL, vaultCA, tokenFile), 0o600); err != nil {
		t.Fatal(err)
	}

	runUpstream(t, f, upstreamRun{name: "Vault", config: config, root: vaultRoot, nameConstraint: true, pathLenZero: true,
		stop: func() error { return v.Stop() }, start: func() error { return v.Restart(t.Context()) },
		failureLog: "vault"})
}

// upstreamRun is one upstream CA for runUpstream: the CA's
// --ca-upstream-config, the upstream's root, and how to stop and start
// the upstream.
type upstreamRun struct {
	name, config string
	root         *x509.Certificate
	// nameConstraint: the upstream constrains the intermediate to the
	// trust domain's URIs; pathLenZero: to path length 0.
	nameConstraint, pathLenZero bool
	stop, start                 func() error
	// failureLog is in the log line of a failed attempt.
	failureLog string
}

// runUpstream runs a CA with no root of its own on intermediates the
// upstream issues: a 90s intermediate (backdated 30s by Vault, not by
// cert-manager), so one rotation of it within a minute or two. Leaves
// verify to the upstream's root; the rotation runs under load while the
// upstream is stopped through the first attempts to prepare the next
// intermediate, and is taken once it is back, with no request failing and
// the replica ready all along.
func runUpstream(t *testing.T, f *lcFixture, u upstreamRun) {
	t.Helper()
	began := time.Now()
	tokens := f.ztunnels(t, 2)
	bw := watchBundles(t, f.s, f.signer)
	ca := f.start(t, "--ca-upstream-config", u.config, "--ca-ttl", "90s", "--max-ttl", "8s", "--default-ttl", "8s",
		"--rotation-propagation-delay", "4s", "--rotation-skew-margin", "2s", "--serving-ttl", "10s")
	first := f.mustState(t)
	if first.Kind != castate.KindUpstream || !first.Active().Chain[len(first.Active().Chain)-1].Equal(u.root) {
		t.Fatalf("CA Secret of kind %q; want an upstream intermediate chaining to %s's root", first.Kind, u.name)
	}
	bw.waitRoots(t, lcWait, u.root)
	t.Logf("serving on an intermediate from %s %v after start", u.name, time.Since(began).Round(time.Millisecond))
	roots := []*x509.Certificate{u.root}

	t.Run("leaves verify to the upstream's root, through the intermediate it issued", func(t *testing.T) {
		res := requestFrom(t, ca, f.s.ztunnelA, id("demo", "web"))
		if err := verifiesWith(res.Leaf, res.Chain, roots, time.Now()); err != nil {
			t.Fatal(err)
		}
		if len(res.Roots) != 1 || !res.Roots[0].Equal(u.root) {
			t.Errorf("the answer's root bundle holds %s, want the upstream's root alone", subjects(res.Roots))
		}
		inter := res.Chain[0]
		switch zero := inter.MaxPathLen == 0 && inter.MaxPathLenZero; {
		case u.pathLenZero && !zero:
			t.Errorf("the intermediate has path length %d (zero %v), want 0", inter.MaxPathLen, inter.MaxPathLenZero)
		case !u.pathLenZero && len(logLines(ca, "may issue CA certificates", "path_length")) == 0:
			t.Error("an intermediate without path length 0 was taken without a warning in the log")
		}
		if u.nameConstraint && (len(inter.PermittedURIDomains) != 1 || inter.PermittedURIDomains[0] != "cluster.local") {
			t.Errorf("the intermediate has URI name constraints %v, want cluster.local", inter.PermittedURIDomains)
		}
	})

	load := startLoad(tokens, loadIdentities, 250*time.Millisecond, func() []*cahost.CA { return []*cahost.CA{ca} }, bw.current)
	t.Cleanup(func() { load.stop() })
	ready := watchReady(t, ca)

	// Stop the upstream before the prepare step is due (at half-life),
	// start it again after a few failed attempts.
	a := first.Active().Cert
	prepareAt := a.NotBefore.Add(a.NotAfter.Sub(a.NotBefore) / 2)
	time.Sleep(time.Until(prepareAt.Add(-3 * time.Second)))
	if err := u.stop(); err != nil {
		t.Fatal(err)
	}
	waitLogLines(t, ca, "rotation step failed, will retry", u.failureLog)
	samples, err := scrapeCA(t.Context(), ca)
	if err != nil {
		t.Fatal(err)
	}
	if left, n := samples.Sum("workload_ca_upstream_expiry_without_successor_seconds"); n != 1 || left <= 0 {
		t.Errorf("with the upstream down and the successor due, workload_ca_upstream_expiry_without_successor_seconds = %v (%d series), want the time left", left, n)
	}
	if errs, _ := samples.Sum("workload_ca_upstream_requests_total", "result", "error"); errs < 1 {
		t.Errorf("workload_ca_upstream_requests_total{result=error} = %v, want the failed attempts", errs)
	}
	time.Sleep(5 * time.Second)
	if err := u.start(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()

	var st castate.State
	err = pollUntil(t, 60*time.Second, func() (bool, error) {
		var err error
		st, err = f.state(t.Context())
		return err == nil && !st.Active().Cert.Equal(a), err
	})
	if err != nil {
		t.Fatalf("the next intermediate never signs: %v", err)
	}
	t.Logf("%s back at %+.1fs; the next intermediate active at %+.1fs", u.name, restarted.Sub(began).Seconds(), time.Since(began).Seconds())
	time.Sleep(2 * time.Second) // leaves of the new intermediate
	issued, failures := load.stop()
	notReady := ready.stop()
	reportFailures(t, failures)
	t.Run("leaves came from both intermediates, all verifying to the upstream's root", func(t *testing.T) {
		from := map[string]int{}
		for _, is := range issued {
			if err := verifiesWith(is.res.Leaf, is.res.Chain, roots, is.received); err != nil {
				t.Fatalf("leaf does not verify to the upstream's root: %v", err)
			}
			from[fmt.Sprintf("%x", is.res.Chain[0].SerialNumber)]++
		}
		if len(from) < 2 || len(issued) < 20 {
			t.Errorf("%d leaves from %d intermediates, want leaves of the old and the new", len(issued), len(from))
		}
		t.Logf("%d leaves, by intermediate: %v", len(issued), from)
	})
	t.Run("the replica stayed ready while the upstream was down", func(t *testing.T) {
		if len(notReady) > 0 {
			t.Errorf("/readyz failed: %s", strings.Join(notReady, "; "))
		}
	})
	t.Run("metrics show the recovery", func(t *testing.T) {
		samples, err := scrapeCA(t.Context(), ca)
		if err != nil {
			t.Fatal(err)
		}
		if _, n := samples.Sum("workload_ca_upstream_expiry_without_successor_seconds"); n > 0 {
			t.Error("the successor is in place, but the time-left gauge is still exported")
		}
		if n, _ := samples.Sum("workload_ca_upstream_requests_total", "result", "issued"); n < 1 {
			t.Errorf("workload_ca_upstream_requests_total{result=issued} = %v after the rotation", n)
		}
	})
}

// readyWatch polls a replica's /readyz and records each failure.
type readyWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	fails  []string
}

func watchReady(t *testing.T, ca *cahost.CA) *readyWatch {
	ctx, cancel := context.WithCancel(t.Context())
	w := &readyWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ca.AdminAddr()+"/readyz", nil)
			resp, err := http.DefaultClient.Do(req)
			if ctx.Err() != nil {
				return
			}
			if err != nil || resp.StatusCode != http.StatusOK {
				w.fails = append(w.fails, fmt.Sprintf("%s: %v %v", time.Now().Format("15:04:05.000"), err, statusOf(resp)))
			}
			if resp != nil {
				resp.Body.Close()
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

func (w *readyWatch) stop() []string {
	w.cancel()
	<-w.done
	return w.fails
}

func statusOf(resp *http.Response) string {
	if resp == nil {
		return ""
	}
	return resp.Status
}
