package server_test

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/authz/authztest"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testlog"
	"github.com/workload-ca/workload-ca/issuance"
	"github.com/workload-ca/workload-ca/proto/capb"
	"github.com/workload-ca/workload-ca/server"
)

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

// env is a CA served in process over bufconn through the real TLS stack.
type env struct {
	svc       *server.Service
	authority *ca.Authority
	authn     *authztest.Authenticator
	ready     readyErr
	audit     *testlog.Buffer
	obs       *recorder
	lis       *bufconn.Listener
	roots     *x509.CertPool
	accepted  atomic.Int32       // connections the server accepted
	stop      context.CancelFunc // begins the server's shutdown
	served    chan struct{}      // closed when Serve has returned
	serveErr  error
}

const servingName = "workload-ca.istio-system.svc"

// envConfig adjusts the server of an env.
type envConfig struct {
	opts          []grpc.ServerOption
	shutdownDelay time.Duration
	wrapSigner    func(issuance.Signer) issuance.Signer
	service       func(*server.Config)
	// auditTo, if set, receives the audit records instead of env.audit.
	auditTo  io.Writer
	listener func(net.Listener) net.Listener
	// transport's busy tier is the server's (WithBusyTier); its other
	// fields come through opts.
	transport server.Transport
}

type envOption func(*envConfig)

// newPipeline is the pipeline a test's service hands its requests to.
func newPipeline(t testing.TB, cfg issuance.Config) *issuance.Pipeline {
	t.Helper()
	p, err := issuance.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newEnv(t testing.TB, m *ca.Material, options ...envOption) *env {
	t.Helper()
	var cfg envConfig
	for _, o := range options {
		o(&cfg)
	}
	authority, err := ca.New(ca.Config{TrustDomain: td}, m)
	if err != nil {
		t.Fatal(err)
	}
	policy := testPolicy(t)
	e := &env{authority: authority, lis: bufconn.Listen(1 << 20), roots: x509.NewCertPool(),
		audit: &testlog.Buffer{}, obs: &recorder{},
		authn: testAuthenticator(), served: make(chan struct{})}
	for _, r := range authority.Roots() {
		e.roots.AddCert(r)
	}
	var signer issuance.Signer = authority
	if cfg.wrapSigner != nil {
		signer = cfg.wrapSigner(signer)
	}
	svcCfg := server.Config{Authenticator: e.authn, Authorizer: policy,
		Pipeline: newPipeline(t, issuance.Config{Signer: signer, Observer: e.obs, Audit: slog.New(slog.NewJSONHandler(cmp.Or[io.Writer](cfg.auditTo, e.audit), nil))}),
		Ready:    e.ready.get, ClusterID: caclient.DefaultClusterID}
	if cfg.service != nil {
		cfg.service(&svcCfg)
	}
	svc, err := server.NewService(svcCfg)
	if err != nil {
		t.Fatal(err)
	}
	e.svc = svc
	serving, err := server.NewServingCert(context.Background(), server.ServingCertConfig{Issuer: authority, DNSNames: []string{servingName}})
	if err != nil {
		t.Fatal(err)
	}
	g := server.NewGRPCServer(svc, server.TLSConfig(serving.GetCertificate, 0), cfg.opts...).WithBusyTier(cfg.transport)
	g.ShutdownDelay = cfg.shutdownDelay
	ctx, cancel := context.WithCancel(context.Background())
	e.stop = cancel
	var lis net.Listener = countingListener{e.lis, &e.accepted}
	if cfg.listener != nil {
		lis = cfg.listener(lis)
	}
	go func() { e.serveErr = g.Serve(ctx, lis); close(e.served) }()
	t.Cleanup(func() {
		cancel()
		<-e.served
		if e.serveErr != nil {
			t.Errorf("Serve() = %v", e.serveErr)
		}
	})
	return e
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n *atomic.Int32
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// testAuthenticator knows the tokens of ztunnel-a and web-1 (see
// testPolicy).
func testAuthenticator() *authztest.Authenticator {
	return &authztest.Authenticator{Callers: map[string]authz.Caller{
		"ztunnel-token": {Namespace: "istio-system", ServiceAccount: "ztunnel", PodName: "ztunnel-a", PodUID: "zt-a", NodeName: "node-a"},
		"web-token":     {Namespace: "demo", ServiceAccount: "web", PodName: "web-1", PodUID: "web-1", NodeName: "node-a"},
	}}
}

// testPolicy is the node-scoped policy over a cluster of three pods: a
// ztunnel and web on node-a, db on node-b.
func testPolicy(tb testing.TB) *authz.Policy {
	tb.Helper()
	pods := &authztest.Pods{}
	pods.Add("istio-system", "ztunnel-a", authz.PodInfo{UID: "zt-a", NodeName: "node-a", ServiceAccount: "ztunnel"})
	pods.Add("demo", "web-1", authz.PodInfo{UID: "web-1", NodeName: "node-a", ServiceAccount: "web"})
	pods.Add("demo", "db-1", authz.PodInfo{UID: "db-1", NodeName: "node-b", ServiceAccount: "db"})
	policy, err := authz.NewPolicy(authz.PolicyConfig{TrustDomain: td, Pods: pods,
		NodeAgents: []authz.NodeAgent{{Namespace: "istio-system", ServiceAccount: "ztunnel"}}})
	if err != nil {
		tb.Fatal(err)
	}
	return policy
}

func (e *env) dialer() grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return e.lis.DialContext(ctx) })
}

func (e *env) client(t testing.TB) *caclient.Client {
	t.Helper()
	c, err := caclient.Dial(caclient.Config{Address: "passthrough:///" + servingName, Roots: e.roots, DialOptions: []grpc.DialOption{e.dialer()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestZtunnelRoundTripSelfSignedRoot(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	e := newEnv(t, root.Material())
	web := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	res, err := e.client(t).CreateCertificate(ctxT(t), caclient.Request{Token: "ztunnel-token", Identity: web, Impersonate: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.PEM) != 2 || len(res.Chain) != 0 || !res.Roots[0].Equal(root.Cert) {
		t.Fatalf("chain = %d elements, %d intermediates; want [leaf, root]", len(res.PEM), len(res.Chain))
	}
	bundle := x509bundle.FromX509Authorities(td, e.authority.Roots())
	id, _, err := x509svid.Verify([]*x509.Certificate{res.Leaf}, bundle)
	if err != nil || id != web {
		t.Fatalf("x509svid.Verify = %v, %v", id, err)
	}
}

func TestRoundTripIntermediateChain(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P256)
	signing := testca.NewIntermediate(t, mid, testca.P256)
	other := testca.NewRoot(t, testca.P256)
	e := newEnv(t, signing.Material(other.Cert))
	own := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	res, err := e.client(t).CreateCertificate(ctxT(t), caclient.Request{Token: "web-token", Identity: own})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.PEM) != 4 || !res.Chain[0].Equal(signing.Cert) || !res.Chain[1].Equal(mid.Cert) || len(res.Roots) != 2 {
		t.Fatalf("chain: %d elements, %d roots in the last; want [leaf, signing, mid, bundle of 2]", len(res.PEM), len(res.Roots))
	}
	if err := res.Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestErrorCodes(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	e := newEnv(t, root.Material())
	c := e.client(t)
	id := spiffeid.RequireFromString
	tests := []struct {
		name  string
		req   caclient.Request
		setup func()
		want  codes.Code
	}{
		{name: "no token", req: caclient.Request{Identity: id("spiffe://cluster.local/ns/demo/sa/web")}, want: codes.Unauthenticated},
		{name: "ztunnel of another cluster", req: caclient.Request{Token: "ztunnel-token", Identity: id("spiffe://cluster.local/ns/demo/sa/web"), Impersonate: true, ClusterID: "east"}, want: codes.Unauthenticated},
		{name: "unknown token", req: caclient.Request{Token: "garbage", Identity: id("spiffe://cluster.local/ns/demo/sa/web")}, want: codes.Unauthenticated},
		{name: "workload impersonating", req: caclient.Request{Token: "web-token", Identity: id("spiffe://cluster.local/ns/demo/sa/db"), Impersonate: true}, want: codes.PermissionDenied},
		{name: "ztunnel asking for another node's identity", req: caclient.Request{Token: "ztunnel-token", Identity: id("spiffe://cluster.local/ns/demo/sa/db"), Impersonate: true}, want: codes.PermissionDenied},
		{name: "foreign trust domain", req: caclient.Request{Token: "ztunnel-token", Identity: id("spiffe://evil.example/ns/demo/sa/web"), Impersonate: true}, want: codes.PermissionDenied},
		{name: "CSR names another identity than the granted one", req: caclient.Request{Token: "web-token", Identity: id("spiffe://cluster.local/ns/demo/sa/other")}, want: codes.InvalidArgument},
		{name: "not ready", setup: func() { e.ready.set(context.DeadlineExceeded) }, req: caclient.Request{Token: "web-token", Identity: id("spiffe://cluster.local/ns/demo/sa/web")}, want: codes.Unavailable},
		{name: "authentication backend down", setup: func() { e.authn.Err = authz.ErrUnavailable }, req: caclient.Request{Token: "web-token", Identity: id("spiffe://cluster.local/ns/demo/sa/web")}, want: codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.ready.set(nil)
			e.authn.Err = nil
			if tt.setup != nil {
				tt.setup()
			}
			_, err := c.CreateCertificate(ctxT(t), tt.req)
			if status.Code(err) != tt.want {
				t.Fatalf("CreateCertificate() = %v, want code %v", err, tt.want)
			}
		})
	}
}

func TestMalformedRequestsAreInvalidArgument(t *testing.T) {
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material())
	conn := e.conn(t)
	svc := capb.NewIstioCertificateServiceClient(conn)
	badIdentity := &capb.IstioCertificateRequest{Csr: "not a csr", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		server.ImpersonatedIdentityKey: structpb.NewStringValue("https://not/spiffe")}}}
	for name, req := range map[string]*capb.IstioCertificateRequest{
		"empty CSR":                             {},
		"garbage CSR":                           {Csr: "not a csr"},
		"impersonated identity not a SPIFFE ID": badIdentity,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := svc.CreateCertificate(withToken(ctxT(t), "web-token"), req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("CreateCertificate() = %v, want InvalidArgument", err)
			}
		})
	}
	// Authentication comes first: a caller without a valid token learns
	// nothing of its CSR and spends no CPU slot on it.
	for name, token := range map[string]string{"unknown token": "garbage", "no token": ""} {
		t.Run("malformed request, "+name, func(t *testing.T) {
			ctx := ctxT(t)
			if token != "" {
				ctx = withToken(ctx, token)
			}
			for _, req := range []*capb.IstioCertificateRequest{{Csr: "not a csr"}, badIdentity} {
				if _, err := svc.CreateCertificate(ctx, req); status.Code(err) != codes.Unauthenticated {
					t.Fatalf("CreateCertificate() = %v, want Unauthenticated", err)
				}
			}
		})
	}
	t.Run("oversized request", func(t *testing.T) {
		_, err := svc.CreateCertificate(withToken(ctxT(t), "web-token"), &capb.IstioCertificateRequest{Csr: string(make([]byte, server.MaxRequestSize))})
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("CreateCertificate() = %v, want ResourceExhausted", err)
		}
	})
}

func TestHealthFollowsReadiness(t *testing.T) {
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material())
	h := healthpb.NewHealthClient(e.conn(t))
	req := &healthpb.HealthCheckRequest{Service: capb.IstioCertificateService_ServiceDesc.ServiceName}
	resp, err := h.Check(ctxT(t), req)
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v; want SERVING", resp, err)
	}
	// The health service polls readiness, so it turns NOT_SERVING shortly
	// after readiness fails.
	e.ready.set(context.DeadlineExceeded)
	for ctx := ctxT(t); ; {
		resp, err := h.Check(ctx, req)
		if err != nil {
			t.Fatalf("health check: %v", err)
		}
		if resp.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTLS12RefusedByDefault(t *testing.T) {
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material())
	conn, err := e.lis.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := tls.Client(conn, &tls.Config{RootCAs: e.roots, ServerName: servingName, MaxVersion: tls.VersionTLS12, NextProtos: []string{"h2"}})
	if err := c.HandshakeContext(ctxT(t)); err == nil {
		t.Fatal("TLS 1.2 handshake succeeded; want it refused")
	}
	c13 := tls.Client(mustDial(t, e), &tls.Config{RootCAs: e.roots, ServerName: servingName, NextProtos: []string{"h2"}})
	if err := c13.HandshakeContext(ctxT(t)); err != nil {
		t.Fatalf("TLS 1.3 handshake with hostname check against our root: %v", err)
	}
	c13.Close()
}

func mustDial(t *testing.T, e *env) net.Conn {
	conn, err := e.lis.Dial()
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

func (e *env) conn(t testing.TB) *grpc.ClientConn {
	t.Helper()
	creds := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: e.roots, ServerName: servingName})
	conn, err := grpc.NewClient("passthrough:///"+servingName, grpc.WithTransportCredentials(creds), e.dialer())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func withToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func TestAuditRecordsAndObserver(t *testing.T) {
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material())
	c := e.client(t)
	web := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	db := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/db")
	res, err := c.CreateCertificate(ctxT(t), caclient.Request{Token: "ztunnel-token", Identity: web, Impersonate: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateCertificate(ctxT(t), caclient.Request{Token: "ztunnel-token", Identity: db, Impersonate: true}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("want PermissionDenied, got %v", err)
	}
	records := auditRecords(t, e.audit)
	if len(records) != 2 {
		t.Fatalf("audit records = %d, want 2:\n%s", len(records), e.audit.String())
	}
	issued, denied := records[0], records[1]
	want := map[string]string{"decision": "issued", "caller": "istio-system/ztunnel", "pod": "ztunnel-a", "node": "node-a",
		"requested": web.String(), "identity": web.String(), "serial": res.Leaf.SerialNumber.Text(16)}
	for k, v := range want {
		if issued[k] != v {
			t.Errorf("issued record %s = %v, want %v", k, issued[k], v)
		}
	}
	if issued["not_after"] == nil {
		t.Error("issued record has no not_after")
	}
	if issued["time"] == nil || issued["level"] != "INFO" || issued["msg"] != "certificate issued" || denied["level"] != "WARN" {
		t.Errorf("records' time, level or message: %v, %v", issued, denied)
	}
	if denied["decision"] != "denied" || denied["reason"] != "identity-not-on-node" || denied["requested"] != db.String() {
		t.Errorf("denied record = %v", denied)
	}
	if strings.Contains(e.audit.String(), "ztunnel-token") || strings.Contains(e.audit.String(), "REQUEST") {
		t.Fatal("audit log contains the token or the CSR")
	}
	if got := e.obs.results(); got != "issued/,denied/identity-not-on-node" {
		t.Fatalf("observer saw %q", got)
	}
}

// panickingSigner panics on its first call and signs after that.
type panickingSigner struct {
	issuance.Signer
	calls *atomic.Int32
}

func (p panickingSigner) Sign(ctx context.Context, r ca.Request) (*ca.Issued, error) {
	if p.calls.Add(1) == 1 {
		panic("signer bug")
	}
	return p.Signer.Sign(ctx, r)
}

func TestPanicAnswersInternalAndIsAudited(t *testing.T) {
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material(), func(c *envConfig) {
		c.wrapSigner = func(s issuance.Signer) issuance.Signer { return panickingSigner{Signer: s, calls: new(atomic.Int32)} }
	})
	c := e.client(t)
	web := caclient.Request{Token: "web-token", Identity: spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")}
	_, err := c.CreateCertificate(ctxT(t), web)
	if st, _ := status.FromError(err); st.Code() != codes.Internal || st.Message() != "internal error" {
		t.Fatalf("CreateCertificate() = %v, want Internal with no detail", err)
	}
	records := auditRecords(t, e.audit)
	if len(records) != 1 || records[0]["decision"] != "internal" || records[0]["level"] != "ERROR" ||
		!strings.Contains(fmt.Sprint(records[0]["error"]), "panic: signer bug") ||
		!strings.Contains(fmt.Sprint(records[0]["error"]), "panickingSigner.Sign") {
		t.Fatalf("audit records = %v, want one internal record with the panic and its stack", records)
	}
	// The server serves on.
	if _, err := c.CreateCertificate(ctxT(t), web); err != nil {
		t.Fatalf("after the panic: %v", err)
	}
}

// readyErr is the readiness error the service sees. The health service reads
// it from its own goroutine, so it is guarded.
type readyErr struct {
	mu  sync.Mutex
	err error
}

func (r *readyErr) set(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
}

func (r *readyErr) get() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// auditRecords parses the JSON audit records written to b.
func auditRecords(t *testing.T, b *testlog.Buffer) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

// recorder is an issuance.Observer that remembers results.
type recorder struct {
	mu  sync.Mutex
	got []string
}

func (r *recorder) RequestDone(_, result, reason string, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, result+"/"+reason)
}

// count is how many requests had result/reason key.
func (r *recorder) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, g := range r.got {
		if g == key {
			n++
		}
	}
	return n
}

func (r *recorder) results() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.got, ",")
}

// waitingAuthenticator answers when the caller's context ends, as the token
// reviewer does when the API server is slow: with ErrUnavailable wrapping
// the context's error.
type waitingAuthenticator struct{}

func (waitingAuthenticator) Authenticate(ctx context.Context, _ string) (authz.Caller, error) {
	<-ctx.Done()
	return authz.Caller{}, fmt.Errorf("%w: token review: %w", authz.ErrUnavailable, ctx.Err())
}

// A caller whose deadline passes, or who cancels, while its token is being
// reviewed gets DeadlineExceeded or Canceled, not Unavailable: the CA did
// not fail it.
func TestCallerGoneDuringReview(t *testing.T) {
	authority, err := ca.New(ca.Config{TrustDomain: td}, testca.NewRoot(t, testca.P256).Material())
	if err != nil {
		t.Fatal(err)
	}
	svc, err := server.NewService(server.Config{Authenticator: waitingAuthenticator{}, Authorizer: testPolicy(t),
		Pipeline: newPipeline(t, issuance.Config{Signer: authority}), Ready: func() error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	csr, _ := testca.ZtunnelCSR(t, spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web"))
	req := &capb.IstioCertificateRequest{Csr: string(csr)}
	incoming := func(ctx context.Context) context.Context {
		return metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer a.b.c"))
	}
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(incoming(context.Background()), 50*time.Millisecond)
		defer cancel()
		if _, err := svc.CreateCertificate(ctx, req); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("CreateCertificate() = %v, want DeadlineExceeded", err)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(incoming(context.Background()))
		time.AfterFunc(50*time.Millisecond, cancel)
		if _, err := svc.CreateCertificate(ctx, req); status.Code(err) != codes.Canceled {
			t.Fatalf("CreateCertificate() = %v, want Canceled", err)
		}
	})
}

// With a connection age, a client that keeps one connection, as ztunnel
// does, is moved to a new connection now and then (and could land on
// another replica), and none of its requests fails for it.
func TestConnectionAge(t *testing.T) {
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material(), func(c *envConfig) {
		c.opts = append(c.opts, server.Transport{MaxConnectionAge: 200 * time.Millisecond, MaxConnectionAgeGrace: time.Second}.Options()...)
	})
	c := e.client(t)
	web := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	for deadline := time.Now().Add(10 * time.Second); e.accepted.Load() < 3; {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections accepted in 10 s of requests, want a new one every ~200ms", e.accepted.Load())
		}
		if _, err := c.CreateCertificate(ctxT(t), caclient.Request{Token: "web-token", Identity: web}); err != nil {
			t.Fatalf("a request failed while connections aged out: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// After shutdown begins, the server keeps serving, new connections
// included, for ShutdownDelay, with its health NOT_SERVING; then it stops.
func TestShutdownDelay(t *testing.T) {
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material(), func(c *envConfig) { c.shutdownDelay = time.Second })
	web := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	began := time.Now()
	e.stop()
	// A client that connects only now, as one routed here before the
	// cluster learnt the pod is terminating.
	if _, err := e.client(t).CreateCertificate(ctxT(t), caclient.Request{Token: "web-token", Identity: web}); err != nil {
		t.Fatalf("a request on a new connection during the shutdown delay: %v", err)
	}
	h := healthpb.NewHealthClient(e.conn(t))
	resp, err := h.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: capb.IstioCertificateService_ServiceDesc.ServiceName})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health during the shutdown delay = %v, %v; want NOT_SERVING", resp, err)
	}
	select {
	case <-e.served:
		if time.Since(began) < time.Second {
			t.Errorf("stopped %v after shutdown began, before the delay", time.Since(began))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the delay")
	}
}
