package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/internal/promserver"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/trust/clustertrustbundle"
)

// Names every lifecycle fixture uses inside its own namespace.
const (
	lcSecret = "workload-ca"
	lcLease  = "workload-ca"
	// lcWait bounds each wait for the CA to react (publish, repair,
	// reload, take over); the rotation schedules are seconds long.
	lcWait = 15 * time.Second
)

// mRotationPhase is 1 for the rotation phase of the followed CA state.
const mRotationPhase = "workload_ca_rotation_phase"

// lcFixture is one lifecycle test's world: a namespace holding the CA
// Secret and the leader Lease, a signer name of its own (so its
// ClusterTrustBundles never meet the suite CA's or another test's), and
// the replicas it started. Replicas never use the suite CA's Lease
// (istio-system/workload-ca) or signer.
type lcFixture struct {
	s      *suite
	name   string
	ns     string
	signer string
	dir    string
	// env is added to every replica's environment.
	env []string

	mu sync.Mutex
	n  int // replicas started, for their work dir names
}

func newLCFixture(t *testing.T, name string) *lcFixture {
	t.Helper()
	s := suiteFor(t)
	run := rand.String(5) // -count > 1 runs in fresh namespaces
	f := &lcFixture{s: s, name: name + "-" + run, ns: "lc-" + name + "-" + run, signer: name + ".lifecycle.e2e.test/spiffe",
		dir: filepath.Join(s.workDir, "lifecycle", name+"-"+run)}
	createNamespace(t, s, f.ns, nil)
	// Registered first, so it runs after every replica has stopped.
	t.Cleanup(func() { f.deleteBundles(t) })
	return f
}

// args are the flags that put a replica in the fixture's world.
func (f *lcFixture) args(secretMode bool) []string {
	a := []string{"--signer-name", f.signer, "--leader-election-namespace", f.ns, "--leader-election-id", lcLease}
	if secretMode {
		a = append(a, "--ca-secret", f.ns+"/"+lcSecret)
	}
	return a
}

// startReplica starts `workload-ca serve` with the fixture's flags and
// extra (later flags win); with workDir "" it gets one under the suite's
// work dir. It does not touch t, so replicas can start concurrently.
func (f *lcFixture) startReplica(ctx context.Context, workDir string, secretMode bool, extra ...string) (*cahost.CA, error) {
	if workDir == "" {
		f.mu.Lock()
		f.n++
		workDir = filepath.Join(f.dir, fmt.Sprintf("replica-%d", f.n))
		f.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return cahost.Start(ctx, cahost.Options{
		Kubeconfig: f.s.cp.KubeconfigPath(),
		WorkDir:    workDir,
		Env:        f.env,
		ExtraArgs:  append(f.args(secretMode), extra...),
	})
}

// start starts one replica in --ca-secret mode and stops it when t ends.
func (f *lcFixture) start(t *testing.T, extra ...string) *cahost.CA {
	t.Helper()
	ca, err := f.startReplica(t.Context(), "", true, extra...)
	if err != nil {
		t.Fatal(err)
	}
	f.stopAtCleanup(t, ca)
	return ca
}

// startN starts n replicas in --ca-secret mode at once and waits until
// every one serves.
func (f *lcFixture) startN(t *testing.T, n int, extra ...string) []*cahost.CA {
	t.Helper()
	cas, errs := make([]*cahost.CA, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { cas[i], errs[i] = f.startReplica(t.Context(), "", true, extra...) })
	}
	wg.Wait()
	for _, ca := range cas {
		if ca != nil {
			f.stopAtCleanup(t, ca)
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return cas
}

// stopAtCleanup stops ca when t ends, naming its log if t failed.
func (f *lcFixture) stopAtCleanup(t *testing.T, ca *cahost.CA) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replica pid %d (%s), log %s; last lines:\n%s", ca.Pid(), ca.Addr(), ca.LogPath(), lastLines(ca.Logs(), 15))
		}
		if err := ca.Stop(); err != nil {
			t.Errorf("stop replica pid %d: %v", ca.Pid(), err)
		}
	})
}

// deleteBundles removes the ClusterTrustBundles of the fixture's signer,
// and the Istio-compatible one (at most one test publishes it).
func (f *lcFixture) deleteBundles(t *testing.T) { deleteSignerBundles(t, f.s, f.signer) }

// deleteSignerBundles removes the ClusterTrustBundles of signer and the
// Istio-compatible one, for cleanups.
func deleteSignerBundles(t *testing.T, s *suite, signer string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bundles := s.cp.Client().CertificatesV1().ClusterTrustBundles()
	list, err := bundles.List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=" + signer})
	if err != nil {
		t.Errorf("list bundles: %v", err)
		return
	}
	names := []string{clustertrustbundle.IstioBundleName}
	for _, b := range list.Items {
		names = append(names, b.Name)
	}
	for _, n := range names {
		if err := bundles.Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete bundle %s: %v", n, err)
		}
	}
}

// secret returns the CA Secret.
func (f *lcFixture) secret(ctx context.Context) (*corev1.Secret, error) {
	return f.s.cp.Client().CoreV1().Secrets(f.ns).Get(ctx, lcSecret, metav1.GetOptions{})
}

// state decodes the CA state in the Secret.
func (f *lcFixture) state(ctx context.Context) (castate.State, error) {
	sec, err := f.secret(ctx)
	if err != nil {
		return castate.State{}, err
	}
	return castate.Decode(sec.Data)
}

// mustState is state for the test goroutine.
func (f *lcFixture) mustState(t *testing.T) castate.State {
	t.Helper()
	st, err := f.state(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// seed creates the CA Secret with one active root valid from notBefore to
// notAfter, as a replica would have created it at notBefore. A rotation
// test picks where in its root's life it starts this way (see
// lifecycleRotationFlags for why the binary's own roots cannot be used).
func (f *lcFixture) seed(t *testing.T, notBefore, notAfter time.Time) *x509.Certificate {
	t.Helper()
	root := testca.NewRoot(t, testca.P256, testca.Validity(notBefore, notAfter))
	data, err := castate.Encode(castate.State{Authorities: []castate.Authority{{
		Cert: root.Cert, Key: root.Key, Status: castate.StatusActive, PreparedAt: notBefore, ActivatedAt: notBefore,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: lcSecret, Labels: map[string]string{castate.LabelManagedBy: castate.ManagedByValue}},
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}
	if _, err := f.s.cp.Client().CoreV1().Secrets(f.ns).Create(t.Context(), sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return root.Cert
}

// holder returns the Lease's holder identity, "" when none.
func (f *lcFixture) holder(ctx context.Context) (string, error) {
	l, err := f.s.cp.Client().CoordinationV1().Leases(f.ns).Get(ctx, lcLease, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil || l.Spec.HolderIdentity == nil {
		return "", err
	}
	return *l.Spec.HolderIdentity, nil
}

// ztunnels creates n ztunnel pods on node-a (named after the fixture) and
// returns a pod-bound token of each: n simulated ztunnels that may ask for
// demo/web and demo/api, whose pods run on node-a.
func (f *lcFixture) ztunnels(t *testing.T, n int) []string {
	t.Helper()
	tokens := make([]string, n)
	for i := range n {
		pod := f.s.createPod(t, "istio-system", fmt.Sprintf("ztunnel-%s-%d", f.name, i), "ztunnel", "node-a")
		t.Cleanup(func() {
			zero := int64(0)
			_ = f.s.cp.Client().CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		})
		tok, err := f.s.mintFor(t.Context(), pod, audience, 3600)
		if err != nil {
			t.Fatal(err)
		}
		tokens[i] = tok
	}
	return tokens
}

// leaderIdentities returns the identities under which ca has started
// leading, from its log.
func leaderIdentities(ca *cahost.CA) []string {
	var ids []string
	for line := range strings.SplitSeq(ca.Logs(), "\n") {
		if !strings.Contains(line, `"msg":"started leading"`) {
			continue
		}
		var rec struct{ Identity string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Identity != "" {
			ids = append(ids, rec.Identity)
		}
	}
	return ids
}

// logLines returns the lines of ca's log that hold every one of parts.
func logLines(ca *cahost.CA, parts ...string) []string {
	var out []string
	for line := range strings.SplitSeq(ca.Logs(), "\n") {
		ok := line != ""
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// waitLogLines waits until ca's log holds a line with every one of parts
// and returns those lines. The log reaches its file through a pipe, so a
// line the CA writes just after an API write the test has seen may not be
// there yet.
func waitLogLines(t *testing.T, ca *cahost.CA, parts ...string) []string {
	t.Helper()
	var lines []string
	err := pollUntil(t, lcWait, func() (bool, error) {
		lines = logLines(ca, parts...)
		return len(lines) > 0, nil
	})
	if err != nil {
		t.Fatalf("no log line with %q: %v", parts, err)
	}
	return lines
}

// scrapeCA fetches and parses ca's /metrics without failing the test, for
// polling loops and goroutines.
func scrapeCA(ctx context.Context, ca *cahost.CA) (promserver.Samples, error) {
	return promserver.Scrape(ctx, ca.AdminAddr())
}

// metricPhase returns the phase whose workload_ca_rotation_phase is 1.
func metricPhase(ctx context.Context, ca *cahost.CA) (string, error) {
	samples, err := scrapeCA(ctx, ca)
	if err != nil {
		return "", err
	}
	var phases []string
	for _, s := range samples.Match(mRotationPhase) {
		if s.Value == 1 {
			phases = append(phases, s.Labels["phase"])
		}
	}
	if len(phases) != 1 {
		return "", fmt.Errorf("%s is 1 for %v, want exactly one phase", mRotationPhase, phases)
	}
	return phases[0], nil
}

// isLeader reports ca's workload_ca_leader.
func isLeader(ctx context.Context, ca *cahost.CA) (bool, error) {
	samples, err := scrapeCA(ctx, ca)
	if err != nil {
		return false, err
	}
	v, n := samples.Sum(mLeader)
	if n != 1 {
		return false, fmt.Errorf("%d %s series", n, mLeader)
	}
	return v == 1, nil
}

// theLeader waits until exactly one of cas reports workload_ca_leader 1
// and returns its index.
func theLeader(t *testing.T, cas []*cahost.CA) int {
	t.Helper()
	leader := -1
	var last string
	err := pollUntil(t, lcWait, func() (bool, error) {
		var leaders []int
		for i, ca := range cas {
			ok, err := isLeader(t.Context(), ca)
			if err != nil {
				last = err.Error()
				return false, nil
			}
			// The metric is set just before "started leading" is logged.
			if ok && len(leaderIdentities(ca)) > 0 {
				leaders = append(leaders, i)
			}
		}
		last = fmt.Sprintf("replicas reporting %s 1: %v", mLeader, leaders)
		if len(leaders) == 1 {
			leader = leaders[0]
		}
		return len(leaders) == 1, nil
	})
	if err != nil {
		t.Fatalf("no single leader: %v (%s)", err, last)
	}
	return leader
}

// serveRoots verifies ca's serving certificate over a fresh TLS handshake
// against roots only, and returns the chain it presented.
func serveRoots(ctx context.Context, ca *cahost.CA, roots []*x509.Certificate) ([]*x509.Certificate, error) {
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: &tls.Config{
		MinVersion: tls.VersionTLS13, RootCAs: certPool(roots), ServerName: cahost.ServerName, NextProtos: []string{"h2"},
	}}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", ca.Addr())
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState().PeerCertificates, nil
}

// pemCerts parses every CERTIFICATE block of b.
func pemCerts(b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return certs, nil
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
}

// certPool returns a pool of certs.
func certPool(certs []*x509.Certificate) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool
}

// sameCerts reports whether a and b hold the same certificates, in any
// order, ignoring duplicates.
func sameCerts(a, b []*x509.Certificate) bool {
	in := func(c *x509.Certificate, set []*x509.Certificate) bool { return slices.ContainsFunc(set, c.Equal) }
	for _, c := range a {
		if !in(c, b) {
			return false
		}
	}
	for _, c := range b {
		if !in(c, a) {
			return false
		}
	}
	return true
}

// subjects names certificates in messages.
func subjects(certs []*x509.Certificate) string {
	var s []string
	for _, c := range certs {
		s = append(s, fmt.Sprintf("%q", c.Subject.CommonName))
	}
	return "[" + strings.Join(s, " ") + "]"
}

// verifiesWith checks that leaf chains through inter to one of roots at
// time at, for the workload's mTLS peers (client and server auth).
func verifiesWith(leaf *x509.Certificate, inter, roots []*x509.Certificate, at time.Time) error {
	_, err := leaf.Verify(x509.VerifyOptions{Roots: certPool(roots), Intermediates: certPool(inter), CurrentTime: at,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}})
	return err
}

// bundleSnap is what a pod mounting the signer's bundles (selected by
// signer and our labels; the kubelet merges them) would have seen from at
// on: the union of their roots.
type bundleSnap struct {
	at    time.Time
	names []string
	roots []*x509.Certificate
}

// bundleWatch records every change of the union of our ClusterTrustBundles
// of one signer, with the time the watch delivered it. A time is when the
// test learned of the change, never before it happened: "visible at T"
// below is sound for roots that were added (they were published by T).
type bundleWatch struct {
	signer string
	store  cache.Store

	mu    sync.Mutex
	snaps []bundleSnap
}

// watchBundles starts watching the bundles of signer until t ends and
// returns once the initial list is in.
func watchBundles(t *testing.T, s *suite, signer string) *bundleWatch {
	t.Helper()
	w := &bundleWatch{signer: signer}
	bundles := s.cp.Client().CertificatesV1().ClusterTrustBundles()
	selector := fields.OneTermEqualSelector("spec.signerName", signer).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return bundles.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return bundles.Watch(ctx, o)
		},
	}
	record := func(any) { w.record() }
	var informer cache.Controller
	w.store, informer = cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &certv1.ClusterTrustBundle{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc: record, UpdateFunc: func(_, o any) { record(o) }, DeleteFunc: record,
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); informer.RunWithContext(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if !cache.WaitForCacheSync(t.Context().Done(), informer.HasSynced) {
		t.Fatal("bundle watch: no initial list")
	}
	return w
}

// record appends the current union if it changed. It runs on the
// informer's goroutine, after the store took the event.
func (w *bundleWatch) record() {
	now := time.Now()
	own := map[string]string{clustertrustbundle.LabelManagedBy: clustertrustbundle.ManagedBy, clustertrustbundle.LabelTrustDomain: "cluster.local"}
	var snap bundleSnap
	for _, obj := range w.store.List() {
		b := obj.(*certv1.ClusterTrustBundle)
		if !hasAll(b.Labels, own) {
			continue
		}
		snap.names = append(snap.names, b.Name)
		certs, _ := pemCerts([]byte(b.Spec.TrustBundle)) // a bad edit shows as fewer roots
		for _, c := range certs {
			if !slices.ContainsFunc(snap.roots, c.Equal) {
				snap.roots = append(snap.roots, c)
			}
		}
	}
	slices.Sort(snap.names)
	snap.at = now
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(w.snaps); n > 0 && slices.Equal(w.snaps[n-1].names, snap.names) && sameCerts(w.snaps[n-1].roots, snap.roots) {
		return
	}
	w.snaps = append(w.snaps, snap)
}

func hasAll(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// history returns a copy of the snapshots so far.
func (w *bundleWatch) history() []bundleSnap {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.snaps)
}

// current returns the union seen last (nil before any bundle).
func (w *bundleWatch) current() []*x509.Certificate {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.snaps) == 0 {
		return nil
	}
	return w.snaps[len(w.snaps)-1].roots
}

// waitRoots waits until the union is exactly roots.
func (w *bundleWatch) waitRoots(t *testing.T, timeout time.Duration, roots ...*x509.Certificate) {
	t.Helper()
	err := pollUntil(t, timeout, func() (bool, error) { return sameCerts(w.current(), roots), nil })
	if err != nil {
		t.Fatalf("bundles of %s hold %s, want %s: %v", w.signer, subjects(w.current()), subjects(roots), err)
	}
}

// issued is one answered request of a simulated ztunnel.
type issued struct {
	ztunnel  int
	replica  int
	received time.Time
	res      *caclient.Result
}

// ztunnelLoad is several simulated ztunnels asking for certificates, each
// with its own pod-bound token, a few times a second, over a new TLS
// connection each time that verifies the CA against the roots given by
// roots (the trust bundle a ztunnel mounts).
type ztunnelLoad struct {
	mu       sync.Mutex
	issued   []issued
	failures []string
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// startLoad starts one goroutine per token. Each request goes to the next
// of targets() (round robin per ztunnel) and asks for the next identity.
func startLoad(tokens []string, identities []spiffeid.ID, interval time.Duration,
	targets func() []*cahost.CA, roots func() []*x509.Certificate) *ztunnelLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &ztunnelLoad{cancel: cancel}
	for z, token := range tokens {
		l.wg.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for k := z; ; k++ {
				cas := targets()
				i := k % len(cas)
				l.request(ctx, z, i, cas[i], token, identities[k%len(identities)], roots())
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

func (l *ztunnelLoad) request(ctx context.Context, z, replica int, ca *cahost.CA, token string, id spiffeid.ID, roots []*x509.Certificate) {
	fail := func(err error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.failures = append(l.failures, fmt.Sprintf("%s ztunnel %d → replica %d (%s), %s: %v",
			time.Now().Format("15:04:05.000"), z, replica, ca.Addr(), id, err))
	}
	res, received, err := askAsZtunnel(ctx, ca.Addr(), cahost.ServerName, token, id, roots)
	if ctx.Err() != nil {
		return // stopped: not a failure of the CA
	}
	if err != nil {
		fail(err)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.issued = append(l.issued, issued{ztunnel: z, replica: replica, received: received, res: res})
}

// askAsZtunnel asks the CA at addr (verified as serverName with roots) for
// id with token, as ztunnel does for a pod on its node, on a connection of
// its own, within 5s; it returns the checked answer and when it came.
func askAsZtunnel(ctx context.Context, addr, serverName, token string, id spiffeid.ID, roots []*x509.Certificate) (*caclient.Result, time.Time, error) {
	client, err := caclient.Dial(caclient.Config{Address: addr, Roots: certPool(roots), ServerName: serverName})
	if err != nil {
		return nil, time.Now(), err
	}
	defer client.Close()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := client.CreateCertificate(rctx, caclient.Request{Token: token, Identity: id, Impersonate: true})
	return res, time.Now(), err
}

// stop stops the ztunnels and returns what they got.
func (l *ztunnelLoad) stop() ([]issued, []string) {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.issued), slices.Clone(l.failures)
}

// phaseLog records the rotation phase of the Secret and of each replica's
// metrics, as sequences of distinct consecutive values with when each was
// first seen.
type phaseLog struct {
	mu      sync.Mutex
	cas     []*cahost.CA
	secret  []timedPhase
	metrics map[int][]timedPhase
	errs    []string
	cancel  context.CancelFunc
	done    chan struct{}
}

type timedPhase struct {
	at    time.Time
	phase string
}

func appendPhase(seq []timedPhase, p string) []timedPhase {
	if n := len(seq); n > 0 && seq[n-1].phase == p {
		return seq
	}
	return append(seq, timedPhase{at: time.Now(), phase: p})
}

// watchPhases polls the Secret every 100ms and the metrics of the
// replicas (cas, or those given to replicas later) every 300ms, skipping
// replicas that have exited.
func (f *lcFixture) watchPhases(cas []*cahost.CA) *phaseLog {
	ctx, cancel := context.WithCancel(context.Background())
	p := &phaseLog{cas: cas, metrics: map[int][]timedPhase{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			if st, err := f.state(ctx); err == nil {
				p.mu.Lock()
				p.secret = appendPhase(p.secret, st.Phase())
				p.mu.Unlock()
			}
			p.mu.Lock()
			cas := p.cas
			p.mu.Unlock()
			for i, ca := range cas {
				if n%3 != 0 || ca.Exited() {
					continue
				}
				ph, err := metricPhase(ctx, ca)
				p.mu.Lock()
				if err != nil && ctx.Err() == nil && !ca.Exited() {
					p.errs = append(p.errs, fmt.Sprintf("replica %d: %v", i, err))
				} else if err == nil {
					p.metrics[i] = appendPhase(p.metrics[i], ph)
				}
				p.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// replicas starts polling the metrics of cas too.
func (p *phaseLog) replicas(cas []*cahost.CA) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cas = cas
}

// waitLast waits until the last phase recorded for every replica is
// phase, so that stopping does not cut a sequence short.
func (p *phaseLog) waitLast(t *testing.T, phase string) {
	t.Helper()
	err := pollUntil(t, lcWait, func() (bool, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		for i := range p.cas {
			if seq := p.metrics[i]; len(seq) == 0 || seq[len(seq)-1].phase != phase {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("replicas' %s did not all end in %s: %v", mRotationPhase, phase, err)
	}
}

func (p *phaseLog) stop() {
	p.cancel()
	<-p.done
}

func phases(seq []timedPhase, since time.Time) string {
	var s []string
	for _, p := range seq {
		s = append(s, fmt.Sprintf("%s@%+.1fs", p.phase, p.at.Sub(since).Seconds()))
	}
	return strings.Join(s, " → ")
}

// inOrder reports whether seq holds want as a subsequence.
func inOrder(seq []timedPhase, want ...string) bool {
	i := 0
	for _, p := range seq {
		if i < len(want) && p.phase == want[i] {
			i++
		}
	}
	return i == len(want)
}

// dialCA connects a ztunnel-like client to ca, with the roots ca serves
// now; it is closed when t ends.
func dialCA(t *testing.T, ca *cahost.CA) *caclient.Client {
	t.Helper()
	cfg, err := ca.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	client, err := caclient.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}
