package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/workload-ca/workload-ca/issuance"
)

// Wiring is what the door takes from the rest of the CA: who checks the
// callers of the local cluster and of the remote ones, the pipeline that
// signs, what issues its serving certificate, and where it reports.
type Wiring struct {
	Authenticator Authenticator
	Authorizer    Authorizer
	// ClusterID and Remote: see Config.
	ClusterID string
	Remote    func(id string) (RemoteCluster, bool)
	Pipeline  *issuance.Pipeline
	Issuer    ServingIssuer
	// Ready is the process's readiness (Config.Ready).
	Ready func() error
	// Registerer gets the gRPC and connection metrics.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Door is the gRPC door the Options describe, listening.
type Door struct {
	Service  *Service
	Serving  *ServingCert
	Server   *GRPCServer
	Listener net.Listener
}

// Build makes the door: the service, its serving certificate, the
// listener with its connection bounds, and the gRPC server.
func (o *Options) Build(ctx context.Context, w Wiring) (*Door, error) {
	guard := NewConnGuard(ConnGuardConfig{Deadline: o.AuthDeadline, MaxPerAddress: o.MaxUnauthPerAddr,
		Observer: newConnMetrics(w.Registerer)})
	svc, err := NewService(Config{Connections: guard,
		Authenticator: w.Authenticator, Authorizer: w.Authorizer, Pipeline: w.Pipeline,
		Ready: w.Ready, ClusterID: w.ClusterID, Remote: w.Remote,
		MaxConcurrentSigns: o.MaxConcurrentSigns, QueueTimeout: o.SignQueueTimeout,
		MaxQueued: o.MaxQueued, MaxQueuedPerNode: o.MaxQueuedPerNode,
	})
	if err != nil {
		return nil, err
	}
	d := &Door{Service: svc}
	d.Serving, err = NewServingCert(ctx, ServingCertConfig{Issuer: w.Issuer, DNSNames: o.DNSNames, TTL: o.ServingTTL, Logger: w.Logger})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", o.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("--listen-addr: %w", err)
	}
	d.Listener = guard.Listener(LimitConnections(lis, o.MaxConns))
	d.Server = o.grpcServer(svc, d.Serving, w)
	return d, nil
}

// grpcServer is the gRPC server of svc, with the transport's bounds, its
// metrics and a recovery from panics.
func (o *Options) grpcServer(svc *Service, serving *ServingCert, w Wiring) *GRPCServer {
	grpcMetrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	w.Registerer.MustRegister(grpcMetrics)
	transport := Transport{
		MaxConnectionAge: o.MaxConnAge, MaxConnectionAgeGrace: o.GracePeriod,
		MaxConnectionIdle: o.MaxConnIdle, MaxStreams: o.MaxStreams,
		BusyConnections: o.BusyConns, BusyMaxStreams: o.BusyMaxStreams,
		MaxHeaderListSize: uint32(o.MaxHeaderBytes), HandshakeTimeout: DefaultHandshakeTimeout,
	}
	g := NewGRPCServer(svc, TLSConfig(serving.GetCertificate, o.TLSMinVersion),
		append(transport.Options(), grpc.ChainUnaryInterceptor(grpcMetrics.UnaryServerInterceptor(),
			recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(recoverPanic(w.Logger)))))...).
		WithBusyTier(transport)
	grpcMetrics.InitializeMetrics(g)
	g.GracePeriod, g.ShutdownDelay = o.GracePeriod, o.ShutdownDelay
	return g
}

// recoverPanic answers a panic that a gRPC handler did not turn into an
// error itself: its stack goes to log, never to the caller (the
// interceptor's default handler sends it in the status message).
func recoverPanic(log *slog.Logger) recovery.RecoveryHandlerFunc {
	return func(p any) error {
		log.Error("panic in a gRPC handler", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	}
}

// connMetrics counts the client connections the server closed before any
// caller authenticated on them, by reason (Closed*).
type connMetrics struct{ closed *prometheus.CounterVec }

func newConnMetrics(reg prometheus.Registerer) connMetrics {
	m := connMetrics{closed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "workload_ca_unauthenticated_connections_closed_total",
		Help: "Client connections closed before any caller authenticated on them, by reason (auth-deadline, per-address)."}, []string{"reason"})}
	reg.MustRegister(m.closed)
	return m
}

func (m connMetrics) ConnectionClosed(reason string) { m.closed.WithLabelValues(reason).Inc() }
