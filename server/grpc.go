package server

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"slices"
	"sync"
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/workload-ca/workload-ca/proto/capb"
)

// MaxRequestSize bounds a request message: a CSR is at most 16 KiB.
const MaxRequestSize = 64 << 10

// TLSConfig returns the server TLS configuration: TLS 1.3 unless minVersion
// allows 1.2, and then only AEAD suites with forward secrecy.
func TLSConfig(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), minVersion uint16) *tls.Config {
	if minVersion == 0 {
		minVersion = tls.VersionTLS13
	}
	return &tls.Config{
		MinVersion:     minVersion,
		GetCertificate: getCert,
		CipherSuites: []uint16{ // TLS 1.2 only; 1.3 suites are not configurable.
			tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
			tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
		},
		NextProtos: []string{"h2"},
	}
}

// Flow-control windows. Requests are a few KiB, far below any window, so
// the windows are fixed: gRPC's default bandwidth estimation would otherwise
// ping every connection once per round trip for as long as it lives (it
// only stops once a window has grown to 16 MiB, which small messages never
// cause), costing a write and a read per ping.
const (
	streamWindow = 1 << 16
	connWindow   = 1 << 20
)

// readBufferSize is the read buffer of each connection. gRPC's default of
// 32 KiB is half of what an idle connection costs; TLS buffers each record
// it decrypts anyway, so the HTTP/2 framer reads from TLS directly.
const readBufferSize = 0

// streamWorkers is how many long-lived goroutines handle requests. A new
// goroutine per request grows its stack by copying, and creating it costs
// too; a reused goroutine keeps its grown stack until a garbage collection
// finds it idle and shrinks it. (The CSR checks and signing, the deepest
// stacks, run on the cpuLimiter's own few goroutines.) Requests beyond
// this many in flight get a new goroutine each, as without workers.
const streamWorkers = 256

// GRPCServer serves the certificate service and the standard health service.
type GRPCServer struct {
	grpc   *grpc.Server
	health *health.Server
	svc    *Service
	opts   []grpc.ServerOption // grpc's
	// busy, if set, serves the connections accepted while at least busyAt
	// client connections are open (see WithBusyTier).
	busy   *grpc.Server
	busyAt int
	// GracePeriod bounds how long in-flight requests may take at shutdown.
	GracePeriod time.Duration
	// ShutdownDelay is how long the server keeps serving, new connections
	// included, after shutdown begins and before it drains: the time the
	// cluster takes to stop sending it new connections (kube-proxy and
	// ztunnel learning that the pod is terminating). Meanwhile the health
	// service reports NOT_SERVING.
	ShutdownDelay time.Duration
}

// Transport is what one client connection may hold and how long it lives.
// Every caller, authenticated or not, reaches these limits before any
// handler runs, so they bound what an unauthenticated client can make the
// server keep.
type Transport struct {
	// MaxConnectionAge closes each connection after about this long
	// (grpc-go adds up to 10% of jitter), with a GOAWAY that lets its
	// in-flight requests finish within MaxConnectionAgeGrace. ztunnel
	// keeps one connection to the CA for as long as it runs: without an
	// age, a replica added to share the load, or one back from a restart,
	// gets no ztunnel that connected before it. Zero keeps connections.
	MaxConnectionAge      time.Duration
	MaxConnectionAgeGrace time.Duration
	// MaxConnectionIdle closes a connection that has had no request in
	// flight for this long (pings do not count). Zero keeps them.
	MaxConnectionIdle time.Duration
	// MaxStreams is how many requests one connection may have in flight
	// (at least 1); see DefaultMaxStreamsPerConnection.
	MaxStreams int
	// BusyConnections, if positive, is how many open client connections
	// make the server busy: a connection accepted while at least this many
	// are open may have BusyMaxStreams requests in flight instead of
	// MaxStreams, for as long as it lives (GRPCServer.WithBusyTier). See
	// DefaultBusyConnections.
	BusyConnections int
	BusyMaxStreams  int
	// MaxHeaderListSize bounds the request metadata of one request, as
	// HTTP/2 counts it (names, values and 32 bytes per field); larger
	// requests are refused before their handler.
	MaxHeaderListSize uint32
	// HandshakeTimeout bounds the TLS handshake of a new connection.
	HandshakeTimeout time.Duration
}

// Defaults for Transport.
const (
	// DefaultMaxStreamsPerConnection is how many requests one connection
	// may have in flight (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS). A
	// client wanting more queues them itself (ztunnel asks for 8 at once;
	// its HTTP/2 client waits for a stream). The server's throughput needs
	// only enough requests in flight in all to keep its CPUs busy; every
	// request beyond holds a goroutine and its buffers while it waits, and
	// in a cold start of 5,000 nodes 8 each was 40,000 of them.
	DefaultMaxStreamsPerConnection = 4
	// DefaultBusyConnections and DefaultBusyMaxStreams: once 256 client
	// connections are open (a cluster of hundreds of nodes, or a cold
	// start of thousands), a new connection may have 2 requests in flight.
	// 256 connections at 4 each already keep a replica's CPUs busy; what a
	// 5,000-node cold start sends beyond that only waits in the server,
	// each request holding a goroutine, its stack and its buffers, and the
	// garbage collector's goal grows with those stacks. Its clients wait
	// on their own side instead, at no cost to the server. (At 4 per
	// connection such a storm held 20,000 requests and 1.7 GiB of heap;
	// at 2, half. One per connection was no faster than 2: each answer
	// then goes out in a write of its own.)
	DefaultBusyConnections = 256
	DefaultBusyMaxStreams  = 2
	// DefaultMaxHeaderListSize is 16 KiB: a request carries a token of at
	// most 8 KiB and a few short fields (grpc-go's own default is 16 MiB).
	DefaultMaxHeaderListSize = 16 << 10
	// DefaultMaxConnectionIdle closes connections no request has used for
	// 15 minutes; a node agent renews every few hours and reconnects then.
	DefaultMaxConnectionIdle = 15 * time.Minute
	// DefaultHandshakeTimeout is the time a client gets to finish its TLS
	// handshake (grpc-go's own default is 120 s).
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultMaxConnections bounds the open client connections of one
	// replica: 16,384 nodes, as many as the signing queue's default holds
	// requests for even at DefaultMaxStreamsPerConnection each (~40 KiB
	// each when idle, ~640 MiB in all).
	DefaultMaxConnections = 16384
)

// Options returns the server options that apply t.
func (t Transport) Options() []grpc.ServerOption {
	opts := []grpc.ServerOption{grpc.MaxConcurrentStreams(uint32(max(1, t.MaxStreams)))}
	if t.MaxHeaderListSize > 0 {
		opts = append(opts, grpc.MaxHeaderListSize(t.MaxHeaderListSize))
	}
	if t.HandshakeTimeout > 0 {
		opts = append(opts, grpc.ConnectionTimeout(t.HandshakeTimeout))
	}
	kp := keepalive.ServerParameters{MaxConnectionIdle: t.MaxConnectionIdle}
	if t.MaxConnectionAge > 0 {
		kp.MaxConnectionAge, kp.MaxConnectionAgeGrace = t.MaxConnectionAge, t.MaxConnectionAgeGrace
	}
	return append(opts, grpc.KeepaliveParams(kp))
}

// LimitConnections returns a listener that holds at most n connections
// open at once (n <= 0: no limit). A connection beyond waits in the
// kernel's accept queue until one closes; its client's connect times out
// and retries as it would against a busy server.
func LimitConnections(lis net.Listener, n int) net.Listener {
	if n <= 0 {
		return lis
	}
	return netutil.LimitListener(lis, n)
}

// NewGRPCServer builds the gRPC server over TLS.
func NewGRPCServer(svc *Service, tlsCfg *tls.Config, opts ...grpc.ServerOption) *GRPCServer {
	opts = append([]grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(tlsCfg)),
		grpc.MaxRecvMsgSize(MaxRequestSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.StaticStreamWindowSize(streamWindow),
		grpc.StaticConnWindowSize(connWindow),
		grpc.NumStreamWorkers(streamWorkers),
		grpc.ReadBufferSize(readBufferSize),
	}, opts...)
	g := &GRPCServer{grpc: grpc.NewServer(opts...), health: health.NewServer(), svc: svc, opts: opts, GracePeriod: 15 * time.Second}
	g.register(g.grpc)
	g.updateHealth()
	return g
}

func (g *GRPCServer) register(s *grpc.Server) {
	capb.RegisterIstioCertificateServiceServer(s, g.svc)
	healthpb.RegisterHealthServer(s, g.health)
}

// WithBusyTier has the connections accepted while at least
// t.BusyConnections client connections are open served with at most
// t.BusyMaxStreams requests in flight, for as long as each lives; with no
// BusyConnections it leaves g as it is. Call it before Serve.
func (g *GRPCServer) WithBusyTier(t Transport) *GRPCServer {
	if t.BusyConnections > 0 {
		opts := append(slices.Clone(g.opts), grpc.MaxConcurrentStreams(uint32(max(1, t.BusyMaxStreams))))
		g.busy, g.busyAt = grpc.NewServer(opts...), t.BusyConnections
		g.register(g.busy)
	}
	return g
}

// GetServiceInfo lists the registered services (for metrics
// initialisation).
func (g *GRPCServer) GetServiceInfo() map[string]grpc.ServiceInfo { return g.grpc.GetServiceInfo() }

// Serve serves on lis until ctx ends, then for ShutdownDelay more, then
// stops gracefully: in-flight requests finish (up to GracePeriod) and new
// ones are refused.
func (g *GRPCServer) Serve(ctx context.Context, lis net.Listener) error {
	done := make(chan struct{})
	go g.watchHealth(ctx, done)
	// The refusal summaries are written until the server has stopped,
	// then once more.
	auditCtx, stopAudit := context.WithCancel(context.WithoutCancel(ctx))
	audited := make(chan struct{})
	go func() { g.svc.RunAudit(auditCtx, 0); close(audited) }()
	defer func() { stopAudit(); <-audited }()
	r := g.start(lis)
	select {
	case err := <-r.errc:
		close(done)
		r.stop()
		return firstErr(err, r.wait(nil))
	case <-ctx.Done():
	}
	close(done)
	g.health.Shutdown()
	if g.ShutdownDelay > 0 {
		select {
		case err := <-r.errc:
			r.stop()
			return firstErr(err, r.wait(nil))
		case <-time.After(g.ShutdownDelay):
		}
	}
	r.gracefulStop(g.GracePeriod)
	return r.wait(<-r.errc)
}

// running are the servers serving, and their Serve results.
type running struct {
	servers []*grpc.Server
	errc    chan error
}

// start serves on lis: with the busy tier, the connections accepted while
// it applies go to the busy server.
func (g *GRPCServer) start(lis net.Listener) running {
	r := running{servers: g.servers()}
	listeners := []net.Listener{lis}
	if g.busy != nil {
		split := newSplitListener(lis, g.busyAt)
		go split.run()
		listeners = []net.Listener{split.normal, split.busy}
	}
	r.errc = make(chan error, len(r.servers))
	for i, s := range r.servers {
		go func() { r.errc <- s.Serve(listeners[i]) }()
	}
	return r
}

// wait collects the servers' Serve results once they are stopping, first
// being one already received.
func (r running) wait(first error) error {
	errs := []error{first}
	for range len(r.servers) - 1 {
		errs = append(errs, <-r.errc)
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
	}
	return nil
}

// stop stops every server at once.
func (r running) stop() {
	for _, s := range r.servers {
		s.Stop()
	}
}

// gracefulStop lets in-flight requests finish, for up to grace, then
// stops every server.
func (r running) gracefulStop(grace time.Duration) {
	stopped := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		for _, s := range r.servers {
			wg.Go(s.GracefulStop)
		}
		wg.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(grace):
		r.stop()
	}
}

// firstErr is err, or else more: a failed listener fails both servers
// with the same error, and one server's error stays the error it was.
func firstErr(err, more error) error {
	if err == nil {
		return more
	}
	return err
}

// servers are the gRPC servers behind g: one, or one per tier.
func (g *GRPCServer) servers() []*grpc.Server {
	if g.busy == nil {
		return []*grpc.Server{g.grpc}
	}
	return []*grpc.Server{g.grpc, g.busy}
}

// watchHealth keeps the health service in step with readiness. Readiness
// is a cheap check, so polling it often costs nothing and lets clients see
// SERVING as soon as the pod index has synced.
func (g *GRPCServer) watchHealth(ctx context.Context, done <-chan struct{}) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-t.C:
			g.updateHealth()
		}
	}
}

func (g *GRPCServer) updateHealth() {
	st := healthpb.HealthCheckResponse_SERVING
	if g.svc.ready() != nil {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	g.health.SetServingStatus("", st)
	g.health.SetServingStatus(capb.IstioCertificateService_ServiceDesc.ServiceName, st)
}
