package server_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/proto/capb"
	"github.com/workload-ca/workload-ca/server"
)

// defaultTransport is the server's transport as workload-ca serve sets it.
func defaultTransport() server.Transport {
	return server.Transport{
		MaxStreams: server.DefaultMaxStreamsPerConnection, MaxHeaderListSize: server.DefaultMaxHeaderListSize,
		MaxConnectionIdle: server.DefaultMaxConnectionIdle, HandshakeTimeout: server.DefaultHandshakeTimeout,
	}
}

func withTransport(t server.Transport) envOption {
	return func(c *envConfig) {
		c.opts = append(c.opts, t.Options()...)
		c.transport = t
	}
}

// An unauthenticated client cannot make the server hold megabytes of
// metadata: a request whose headers exceed the limit is refused before any
// check runs (nothing authenticated, audited or issued), one large header
// or many streams of large headers alike, and the connection's next
// ordinary request is served.
func TestOversizedMetadataRefusedBeforeAnyCheck(t *testing.T) {
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material(), withTransport(defaultTransport()))
	c := capb.NewIstioCertificateServiceClient(e.conn(t))
	req := ztunnelRequest(t)
	tests := []struct {
		name    string
		streams int
		md      metadata.MD
	}{
		{"one 8 MiB header", 1, metadata.Pairs("x-junk", strings.Repeat("a", 8<<20))},
		{"a token over the limit", 1, metadata.Pairs("authorization", "Bearer "+strings.Repeat("a", 32<<10))},
		{"500 streams of 64 KiB each", 500, metadata.Pairs("x-junk", strings.Repeat("b", 64<<10))},
		{"many small headers adding up", 1, func() metadata.MD {
			md := metadata.MD{}
			for i := range 2000 {
				md.Append(fmt.Sprintf("x-h%d", i), "v")
			}
			return md
		}()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var wg sync.WaitGroup
			var served atomic.Int32
			for range tc.streams {
				wg.Go(func() {
					ctx := metadata.NewOutgoingContext(ctxT(t), tc.md)
					if _, err := c.CreateCertificate(ctx, req); err == nil {
						served.Add(1)
					} else if status.Code(err) == 0 {
						t.Errorf("error without a code: %v", err)
					}
				})
			}
			wg.Wait()
			if n := served.Load(); n != 0 {
				t.Fatalf("%d of %d oversized requests were served", n, tc.streams)
			}
		})
	}
	if got := e.obs.results(); got != "" {
		t.Errorf("requests reached the handler: %s", got)
	}
	if e.audit.String() != "" {
		t.Errorf("audit records for refused transport input:\n%s", e.audit.String())
	}
	if _, err := c.CreateCertificate(withToken(ctxT(t), "ztunnel-token"), req); err != nil {
		t.Fatalf("an ordinary request after the oversized ones: %v", err)
	}
}

// countingAuthenticator holds every request until release is closed,
// recording how many it holds at once.
type countingAuthenticator struct {
	server.Authenticator
	release           chan struct{}
	inFlight, maxSeen atomic.Int32
}

func (a *countingAuthenticator) Authenticate(ctx context.Context, token string) (authz.Caller, error) {
	n := a.inFlight.Add(1)
	for {
		m := a.maxSeen.Load()
		if n <= m || a.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	defer a.inFlight.Add(-1)
	select {
	case <-a.release:
	case <-ctx.Done():
	}
	return a.Authenticator.Authenticate(ctx, token)
}

// One connection has at most MaxStreams requests in the server at once;
// the client queues the rest itself, and every request is served. Once
// BusyConnections connections are open, a new connection has at most
// BusyMaxStreams, and one that came before still has MaxStreams.
func TestStreamsPerConnectionBounded(t *testing.T) {
	busy := defaultTransport()
	busy.BusyConnections, busy.BusyMaxStreams = 2, 1
	tests := []struct {
		name      string
		transport server.Transport
		// earlier connections open before the one measured, and whether
		// the measured one is the first of them instead
		earlier      int
		measureFirst bool
		want         int32
	}{
		{"the first connection", defaultTransport(), 0, false, server.DefaultMaxStreamsPerConnection},
		{"a connection while not busy", busy, 1, false, server.DefaultMaxStreamsPerConnection},
		{"a connection while busy", busy, 2, false, 1},
		{"a connection from before the server was busy", busy, 2, true, server.DefaultMaxStreamsPerConnection},
		{"no busy tier", func() server.Transport { t := busy; t.BusyConnections = 0; return t }(), 2, false, server.DefaultMaxStreamsPerConnection},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			held := &countingAuthenticator{release: make(chan struct{})}
			e := newEnv(t, testca.NewRoot(t, testca.P256).Material(), withTransport(tt.transport), func(c *envConfig) {
				c.service = func(cfg *server.Config) { held.Authenticator = cfg.Authenticator; cfg.Authenticator = held }
			})
			var conns []*grpc.ClientConn
			for range tt.earlier + 1 {
				conn := e.conn(t)
				// A health check connects without taking a stream slot.
				if _, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
					t.Fatal(err)
				}
				conns = append(conns, conn)
			}
			measured := conns[len(conns)-1]
			if tt.measureFirst {
				measured = conns[0]
			}
			if got := held.concurrency(t, capb.NewIstioCertificateServiceClient(measured), tt.want); got != tt.want {
				t.Errorf("%d requests of one connection in the server at once, want %d", got, tt.want)
			}
		})
	}
}

// concurrency sends 20 requests at once on c, holds them in the server
// until want of them are in or 5 s have passed, lets them go, and returns
// the most that were in the server at once. Every request must succeed.
func (a *countingAuthenticator) concurrency(t *testing.T, c capb.IstioCertificateServiceClient, want int32) int32 {
	t.Helper()
	req := ztunnelRequest(t)
	const n = 20
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.CreateCertificate(withToken(ctxT(t), "ztunnel-token"), req)
			errs <- err
		}()
	}
	for deadline := time.Now().Add(5 * time.Second); a.inFlight.Load() < want; {
		if time.Now().After(deadline) {
			t.Fatalf("only %d requests reached the server", a.inFlight.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // room for one more, were it let in
	close(a.release)
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("request: %v", err)
		}
	}
	return a.maxSeen.Load()
}

// A connection no request uses for MaxConnectionIdle is closed; the
// client's next request opens another and is served.
func TestIdleConnectionClosed(t *testing.T) {
	tr := defaultTransport()
	tr.MaxConnectionIdle = 200 * time.Millisecond
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material(), withTransport(tr))
	c := capb.NewIstioCertificateServiceClient(e.conn(t))
	req := ztunnelRequest(t)
	if _, err := c.CreateCertificate(withToken(ctxT(t), "ztunnel-token"), req); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if _, err := c.CreateCertificate(withToken(ctxT(t), "ztunnel-token"), req); err != nil {
		t.Fatalf("request after the idle close: %v", err)
	}
	if got := e.accepted.Load(); got != 2 {
		t.Errorf("%d connections accepted, want 2 (the idle one closed)", got)
	}
}

// With the connection cap reached, a new connection waits until an open
// one closes, then is served.
func TestConnectionCapHoldsNewConnections(t *testing.T) {
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material(), withTransport(defaultTransport()), func(c *envConfig) {
		c.listener = func(l net.Listener) net.Listener { return server.LimitConnections(l, 1) }
	})
	web := caclient.Request{Token: "web-token", Identity: spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")}
	first := e.client(t)
	if _, err := first.CreateCertificate(ctxT(t), web); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := e.lis.DialContext(ctx); err == nil {
		t.Fatal("a second connection was accepted beyond the cap of 1")
	}
	first.Close()
	second := e.client(t)
	if _, err := second.CreateCertificate(ctxT(t), web); err != nil {
		t.Fatalf("a connection after the first closed: %v", err)
	}
}
