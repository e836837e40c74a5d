package server

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"time"

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
	// GracePeriod bounds how long in-flight requests may take at shutdown.
	GracePeriod time.Duration
	// ShutdownDelay is how long the server keeps serving, new connections
	// included, after shutdown begins and before it drains: the time the
	// cluster takes to stop sending it new connections (kube-proxy and
	// ztunnel learning that the pod is terminating). Meanwhile the health
	// service reports NOT_SERVING.
	ShutdownDelay time.Duration
}

// ConnectionAge returns the server option that closes each connection after
// about age (grpc-go adds up to 10% of jitter), with a GOAWAY that lets its
// in-flight requests finish within grace. ztunnel keeps one connection to
// the CA for as long as it runs: without an age, a replica added to share
// the load, or one back from a restart, gets no ztunnel that connected
// before it. Zero age keeps connections open.
func ConnectionAge(age, grace time.Duration) grpc.ServerOption {
	if age <= 0 {
		return grpc.EmptyServerOption{}
	}
	return grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: age, MaxConnectionAgeGrace: grace})
}

// DefaultMaxStreamsPerConnection is how many requests one connection may
// have in flight (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS). A client
// wanting more queues them itself (ztunnel asks for 8 at once; its HTTP/2
// client waits for a stream). The server's throughput needs only enough
// requests in flight in all to keep its CPUs busy; every request beyond
// holds a goroutine and its buffers while it waits, and in a cold start
// of 5,000 nodes 8 each was 40,000 of them.
const DefaultMaxStreamsPerConnection = 4

// MaxStreamsPerConnection returns the server option that bounds the
// requests in flight on one connection (at least 1).
func MaxStreamsPerConnection(n int) grpc.ServerOption {
	return grpc.MaxConcurrentStreams(uint32(max(1, n)))
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
	g := &GRPCServer{grpc: grpc.NewServer(opts...), health: health.NewServer(), svc: svc, GracePeriod: 15 * time.Second}
	capb.RegisterIstioCertificateServiceServer(g.grpc, svc)
	healthpb.RegisterHealthServer(g.grpc, g.health)
	g.updateHealth()
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
	errc := make(chan error, 1)
	go func() { errc <- g.grpc.Serve(lis) }()
	select {
	case err := <-errc:
		close(done)
		return err
	case <-ctx.Done():
	}
	close(done)
	g.health.Shutdown()
	if g.ShutdownDelay > 0 {
		select {
		case err := <-errc:
			return err
		case <-time.After(g.ShutdownDelay):
		}
	}
	stopped := make(chan struct{})
	go func() { g.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(g.GracePeriod):
		g.grpc.Stop()
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
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
