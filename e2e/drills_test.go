package e2e_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
)

// faultProxy stands between the CA and the API server on loopback: it
// passes connections through, or holds them (a hung API server: accepted,
// never answered), or cuts every open one (a broken watch).
type faultProxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	stall  bool
	conns  map[net.Conn]struct{}
}

func startFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{lis: lis, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { lis.Close(); p.cut() })
	go p.serve()
	return p
}

func (p *faultProxy) serve() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		stalled := p.stall
		p.mu.Unlock()
		if stalled {
			continue // held open, never read: cut() or the client ends it
		}
		go p.pipe(c)
	}
}

func (p *faultProxy) pipe(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	go func() { _, _ = io.Copy(up, stallable{c, p}); up.Close() }()
	_, _ = io.Copy(c, stallable{up, p})
	c.Close()
}

// stallable reads from r, and holds what it read while the proxy stalls
// (a read already waiting when the stall begins must not pass its data).
type stallable struct {
	r io.Reader
	p *faultProxy
}

func (s stallable) Read(b []byte) (int, error) {
	n, err := s.r.Read(b)
	for s.p.stalled() {
		time.Sleep(50 * time.Millisecond)
	}
	return n, err
}

func (p *faultProxy) stalled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stall
}

func (p *faultProxy) setStall(on bool) {
	p.mu.Lock()
	p.stall = on
	p.mu.Unlock()
}

// cut closes every open connection, both sides.
func (p *faultProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// ownControlPlane starts a control plane for one test in dir, with
// namespaces, and stops it when the test ends: for tests that stop or
// hang the API server.
func ownControlPlane(ctx context.Context, t *testing.T, dir string, namespaces ...string) *controlplane.ControlPlane {
	t.Helper()
	cp, err := controlplane.Start(ctx, controlplane.Options{WorkDir: filepath.Join(dir, "controlplane")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Error(err)
		}
	})
	for _, ns := range namespaces {
		if _, err := cp.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	return cp
}

// drillFixture is a control plane of its own (the drills stop and hang its
// API server) and a CA that reaches it through a faultProxy.
type drillFixture struct {
	cp     *controlplane.ControlPlane
	proxy  *faultProxy
	ca     *cahost.CA
	client *caclient.Client
	dir    string
}

const drillNS, drillNode = "drill", "node-d"

func newDrillFixture(t *testing.T) *drillFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cp := ownControlPlane(ctx, t, dir, "istio-system", drillNS)
	f := &drillFixture{cp: cp, dir: dir}
	host, err := url.Parse(cp.Host())
	if err != nil {
		t.Fatal(err)
	}
	f.proxy = startFaultProxy(t, host.Host)
	kc, err := clientcmd.LoadFromFile(cp.KubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range kc.Clusters {
		c.Server = "https://" + f.proxy.lis.Addr().String()
	}
	proxied := filepath.Join(dir, "kubeconfig-proxied")
	if err := clientcmd.WriteToFile(*kc, proxied); err != nil {
		t.Fatal(err)
	}
	for _, sa := range [][2]string{{"istio-system", "ztunnel"}, {drillNS, "web"}, {drillNS, "gone"}, {drillNS, "late"}} {
		if _, err := cp.CreateServiceAccount(ctx, sa[0], sa[1]); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	if _, err := cp.CreateNode(ctx, drillNode); err != nil {
		t.Fatal(err)
	}
	f.ca, err = cahost.Start(ctx, cahost.Options{Kubeconfig: proxied, WorkDir: filepath.Join(dir, "ca"),
		ExtraArgs: []string{"--leader-election-id", "workload-ca-drill"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.ca.Stop(); err != nil {
			t.Error(err)
		}
	})
	f.client = dialCA(t, f.ca)
	return f
}

func (f *drillFixture) pod(t *testing.T, ns, name, sa string) *corev1.Pod {
	t.Helper()
	p, err := f.cp.CreatePod(t.Context(), ns, name, sa, drillNode)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *drillFixture) token(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	tok, err := f.cp.PodToken(t.Context(), p.Namespace, p.Spec.ServiceAccountName, p, audience, 3600)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// ask is the CA's answer to a request with token for identity (empty: the
// caller's own), within timeout.
func (f *drillFixture) ask(t *testing.T, token, identity string, timeout time.Duration) codes.Code {
	t.Helper()
	return f.askOn(t, f.client, token, identity, timeout)
}

// askOn is ask on client's connection.
func (f *drillFixture) askOn(t *testing.T, client *caclient.Client, token, identity string, timeout time.Duration) codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	req := caclient.Request{Token: token}
	if identity != "" {
		req.Identity, req.Impersonate = spiffeid.RequireFromString(identity), true
	} else {
		own, err := ownIdentity(token)
		if err != nil {
			t.Fatal(err)
		}
		req.Identity = own
	}
	_, err := client.CreateCertificate(ctx, req)
	return status.Code(err)
}

// waitFor polls ask until it answers want, and returns how long that took.
func (f *drillFixture) waitFor(t *testing.T, what string, want codes.Code, within time.Duration, ask func() codes.Code) time.Duration {
	t.Helper()
	began := time.Now()
	var got codes.Code
	for time.Since(began) < within {
		if got = ask(); got == want {
			return time.Since(began)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: still %s after %v, want %s", what, got, within, want)
	return 0
}

// TestFaultDrills takes the CA through the failures of its dependencies
// and checks what callers see, measuring each recovery:
//   - the API server stopped for 20 s (etcd kept) and started again;
//   - the API server hung: connections accepted, nothing answered;
//   - the watches cut mid-stream;
//   - the audit log's disk full.
func TestFaultDrills(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	f := newDrillFixture(t)
	zt := f.token(t, f.pod(t, "istio-system", "ztunnel-d", "ztunnel"))
	f.pod(t, drillNS, "web-0", "web")
	web := id(drillNS, "web")
	// A token bound to a Secret: no positive answer about it is cached, so
	// every request with it needs the API server (a TokenReview).
	secret, err := f.cp.Client().CoreV1().Secrets(drillNS).Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bound"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secretTok, err := f.cp.BoundToken(t.Context(), drillNS, "web", "Secret", secret.Name, secret.UID, audience, 3600)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.ask(t, zt, web, 10*time.Second); got != codes.OK {
		t.Fatalf("before the drills: ztunnel asking for web: %s", got)
	}
	if got := f.ask(t, secretTok, "", 10*time.Second); got != codes.OK {
		t.Fatalf("before the drills: a Secret-bound token: %s", got)
	}

	t.Run("API server stopped for 20 s: known callers renew, unknown tokens fail closed, all recovers", func(t *testing.T) {
		if err := f.cp.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		renewed, refused, other := 0, 0, 0
		for time.Since(stopped) < 20*time.Second {
			if got := f.ask(t, zt, web, 5*time.Second); got == codes.OK {
				renewed++
			} else {
				t.Errorf("ztunnel renewing web while the API server is down: %s", got)
			}
			switch got := f.ask(t, secretTok, "", 12*time.Second); got {
			case codes.Unavailable:
				refused++
			default:
				other++
				t.Errorf("a token only the API server can check, while it is down: %s, want Unavailable", got)
			}
			time.Sleep(time.Second)
		}
		if err := f.cp.StartAPIServer(t.Context()); err != nil {
			t.Fatal(err)
		}
		back := f.waitFor(t, "the Secret-bound token after the restart", codes.OK, time.Minute,
			func() codes.Code { return f.ask(t, secretTok, "", 12*time.Second) })
		f.pod(t, drillNS, "late-0", "late")
		synced := f.waitFor(t, "ztunnel asking for a pod created after the restart", codes.OK, time.Minute,
			func() codes.Code { return f.ask(t, zt, id(drillNS, "late"), 5*time.Second) })
		if led, err := isLeader(t.Context(), f.ca); err != nil || !led {
			t.Errorf("after the outage the CA leads: %v, %v; want true", led, err)
		}
		if n := len(logLines(f.ca, `"msg":"stopped leading"`)); n > 0 {
			t.Logf("the CA stepped down %d times during the outage (its Lease could not be renewed)", n)
		}
		t.Logf("outage 20 s: %d renewals served from cache, %d unknown-token requests refused Unavailable (%d other); "+
			"after the restart the API-checked token was served in %v, a new pod authorized in %v more",
			renewed, refused, other, back.Round(10*time.Millisecond), synced.Round(10*time.Millisecond))
	})

	t.Run("API server hung: the CA's timeouts fire, nothing piles up", func(t *testing.T) {
		before := goroutines(t, f.ca)
		f.proxy.setStall(true)
		began := time.Now()
		const n = 20
		var wg sync.WaitGroup
		codesSeen := make([]codes.Code, n)
		for i := range n { // a node each: one connection each
			c := dialCA(t, f.ca)
			wg.Go(func() { codesSeen[i] = f.askOn(t, c, secretTok, "", 30*time.Second) })
		}
		if got := f.ask(t, zt, web, 5*time.Second); got != codes.OK {
			t.Errorf("ztunnel renewing web while the API server hangs: %s", got)
		}
		wg.Wait()
		took := time.Since(began)
		for i, c := range codesSeen {
			if c != codes.Unavailable {
				t.Errorf("request %d with an API-checked token while the API server hangs: %s, want Unavailable", i, c)
			}
		}
		during := goroutines(t, f.ca)
		f.proxy.setStall(false)
		f.proxy.cut()
		back := f.waitFor(t, "the Secret-bound token after the hang", codes.OK, time.Minute,
			func() codes.Code { return f.ask(t, secretTok, "", 12*time.Second) })
		if during-before > 300 {
			t.Errorf("goroutines %d before the hang, %d at its end: the CA piles up work", before, during)
		}
		if took > 15*time.Second {
			t.Errorf("the requests took %v in all, want them refused once the 10 s review timeout fired", took)
		}
		t.Logf("hang: %d API-checked requests refused Unavailable within %v (the review timeout is 10 s); goroutines %d -> %d; served again %v after the hang",
			n, took.Round(10*time.Millisecond), before, during, back.Round(10*time.Millisecond))
	})

	t.Run("watches cut: the index relists, a deleted pod stops authorizing", func(t *testing.T) {
		gone := f.pod(t, drillNS, "gone-0", "gone")
		f.waitFor(t, "ztunnel asking for gone's identity", codes.OK, 30*time.Second,
			func() codes.Code { return f.ask(t, zt, id(drillNS, "gone"), 5*time.Second) })
		f.proxy.cut()
		zero := int64(0)
		if err := f.cp.Client().CoreV1().Pods(drillNS).Delete(t.Context(), gone.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		denied := f.waitFor(t, "ztunnel asking for the deleted pod's identity", codes.PermissionDenied, 30*time.Second,
			func() codes.Code { return f.ask(t, zt, id(drillNS, "gone"), 5*time.Second) })
		t.Logf("watches cut, then a pod deleted: its identity was refused to the node agent %v after the delete", denied.Round(10*time.Millisecond))
	})

	t.Run("audit log's disk full: the CA fails closed", func(t *testing.T) {
		if _, err := os.Stat("/dev/full"); err != nil {
			t.Skip("no /dev/full here")
		}
		ca, err := cahost.Start(t.Context(), cahost.Options{Kubeconfig: f.cp.KubeconfigPath(), WorkDir: filepath.Join(f.dir, "ca-full"),
			ExtraArgs: []string{"--leader-election-id", "workload-ca-full", "--audit-log", "/dev/full"}})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := ca.Stop(); err != nil {
				t.Error(err)
			}
		}()
		_, err = ca.Request(t.Context(), cahost.RequestArgs{Token: zt, Identity: web, Impersonate: true})
		if got := cahost.Code(err); got != codes.Unavailable {
			t.Errorf("with the audit log on a full disk: %s (%v), want Unavailable", got, err)
		}
		if lines := logLines(ca, "audit record not written"); len(lines) == 0 {
			t.Error("the CA did not log that its audit record could not be written")
		}
	})
}

// goroutines is the CA's go_goroutines.
func goroutines(t *testing.T, ca *cahost.CA) int {
	t.Helper()
	samples, err := scrapeCA(t.Context(), ca)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := samples.Sum("go_goroutines")
	return int(v)
}
