package server_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/server"
)

// loopbackEnv is an env served on a loopback TCP listener holding slots
// connections at once, guarded by a ConnGuard on a fake clock.
type loopbackEnv struct {
	*env
	addr   string
	guard  *server.ConnGuard
	clock  *clocktesting.FakeClock
	closed *closedCounter
}

type closedCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *closedCounter) ConnectionClosed(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[reason]++
}

func (c *closedCounter) count(reason string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[reason]
}

func newLoopbackEnv(t *testing.T, slots int, cfg server.ConnGuardConfig) *loopbackEnv {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	le := &loopbackEnv{addr: lis.Addr().String(), clock: clocktesting.NewFakeClock(time.Now()),
		closed: &closedCounter{n: map[string]int{}}}
	cfg.Clock, cfg.Observer = le.clock, le.closed
	le.guard = server.NewConnGuard(cfg)
	le.env = newEnv(t, testca.NewRoot(t, testca.P256).Material(), func(c *envConfig) {
		c.service = func(cfg *server.Config) { cfg.Connections = le.guard }
		c.listener = func(net.Listener) net.Listener { return le.guard.Listener(server.LimitConnections(lis, slots)) }
	})
	return le
}

func (le *loopbackEnv) tlsConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: le.roots, ServerName: servingName, NextProtos: []string{"h2"}}
}

// idleConn is an HTTP/2 connection that says hello and never asks
// anything; gone is closed once the server has closed it.
type idleConn struct {
	conn net.Conn
	gone chan struct{}
}

// openIdle opens an idle connection; nil if the server closed it before
// its TLS handshake ended.
func (le *loopbackEnv) openIdle(t *testing.T) *idleConn {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", le.addr, le.tlsConfig())
	if err != nil {
		return nil
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return nil
	}
	if err := http2.NewFramer(c, nil).WriteSettings(); err != nil {
		return nil
	}
	ic := &idleConn{conn: c, gone: make(chan struct{})}
	go func() { _, _ = io.Copy(io.Discard, c); close(ic.gone) }()
	return ic
}

func (ic *idleConn) closed() bool { return isDone(ic.gone) }

func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// trackingDialer dials the loopback env and counts the connections its
// client opened and those the client saw end.
type trackingDialer struct {
	addr          string
	dials, closes atomic.Int32
}

type trackedConn struct {
	net.Conn
	once sync.Once
	d    *trackingDialer
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.d.closes.Add(1) })
	return c.Conn.Close()
}

func (d *trackingDialer) client(t *testing.T, le *loopbackEnv) *caclient.Client {
	t.Helper()
	dial := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", d.addr)
		if err != nil {
			return nil, err
		}
		d.dials.Add(1)
		return &trackedConn{Conn: c, d: d}, nil
	})
	c, err := caclient.Dial(caclient.Config{Address: "passthrough:///" + servingName, Roots: le.roots, DialOptions: []grpc.DialOption{dial}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// One client that never authenticates cannot hold the connection slots
// for long: with every slot taken (idle connections, and one that only
// sends requests with a bad token) no one else gets in; once the
// deadline passes, the connections on which no caller authenticated are
// closed and their slots freed, while the one on which a ztunnel
// authenticated stays open and serves on.
func TestUnauthenticatedConnectionsClosedAfterDeadline(t *testing.T) {
	const slots = 64
	const deadline = 30 * time.Second
	le := newLoopbackEnv(t, slots, server.ConnGuardConfig{Deadline: deadline})
	web := caclient.Request{Token: "ztunnel-token", Identity: spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web"), Impersonate: true}

	authed := &trackingDialer{addr: le.addr}
	ztunnel := authed.client(t, le)
	if _, err := ztunnel.CreateCertificate(ctxT(t), web); err != nil {
		t.Fatal(err)
	}
	badToken := &trackingDialer{addr: le.addr}
	attacker := badToken.client(t, le)
	if _, err := attacker.CreateCertificate(ctxT(t), caclient.Request{Token: "forged", Identity: web.Identity}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a bad token: %v, want Unauthenticated", err)
	}
	idle := make([]*idleConn, 0, slots-2)
	for range slots - 2 {
		ic := le.openIdle(t)
		if ic == nil {
			t.Fatalf("idle connection %d refused before the slots were full", len(idle)+1)
		}
		idle = append(idle, ic)
	}
	if got := le.guard.Open(); got != slots-1 {
		t.Fatalf("the guard watches %d connections, want %d (all but the authenticated one)", got, slots-1)
	}
	// Every slot is taken: a newcomer's handshake waits to be accepted.
	newcomer := (&trackingDialer{addr: le.addr}).client(t, le)
	if _, err := newcomer.CreateCertificate(ctxFor(t, 500*time.Millisecond), web); err == nil {
		t.Fatal("a new client was served with every connection slot taken")
	}

	le.clock.Step(deadline - time.Second)
	if le.guard.Open() != slots-1 || idle[0].closed() {
		t.Fatal("connections closed before the deadline")
	}
	stepped := time.Now()
	le.clock.Step(time.Second)
	waitFor(t, "the unauthenticated connections closed", func() bool {
		for _, ic := range idle {
			if !ic.closed() {
				return false
			}
		}
		return badToken.closes.Load() == 1
	})
	took := time.Since(stepped)
	waitFor(t, "the observer told of each", func() bool { return le.closed.count(server.ClosedAuthDeadline) == slots-1 })
	// Their slots are free: the newcomer, waiting to be accepted, is
	// served, and its connection is no longer watched.
	if _, err := newcomer.CreateCertificate(ctxT(t), web); err != nil {
		t.Fatalf("a new client once the slots were freed: %v", err)
	}
	if got := le.guard.Open(); got != 0 {
		t.Errorf("the guard watches %d connections, want none", got)
	}
	// The ztunnel's connection is the one it opened first, still.
	le.clock.Step(10 * deadline)
	if _, err := ztunnel.CreateCertificate(ctxT(t), web); err != nil {
		t.Fatal(err)
	}
	if authed.dials.Load() != 1 || authed.closes.Load() != 0 {
		t.Errorf("the authenticated client dialed %d times and saw %d closes, want 1 and 0", authed.dials.Load(), authed.closes.Load())
	}
	t.Logf("%d of %d slots held by unauthenticated connections freed %v after the deadline", slots-1, slots, took.Round(time.Millisecond))
}

// A request still in flight at the deadline gets as long again: if its
// caller authenticates, the connection stays; if it is still in flight
// when the deadline has passed twice, the connection is closed.
func TestAuthDeadlineWaitsForRequestInFlight(t *testing.T) {
	const deadline = 30 * time.Second
	for _, tc := range []struct {
		name       string
		authBefore time.Duration // the held request authenticates this long after the deadline (-1: never)
		wantKept   bool
	}{
		{"authenticates within the grace", 0, true},
		{"still in flight at twice the deadline", -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held := &countingAuthenticator{release: make(chan struct{})}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			clk := clocktesting.NewFakeClock(time.Now())
			guard := server.NewConnGuard(server.ConnGuardConfig{Deadline: deadline, Clock: clk})
			e := newEnv(t, testca.NewRoot(t, testca.P256).Material(), func(c *envConfig) {
				c.service = func(cfg *server.Config) {
					held.Authenticator = cfg.Authenticator
					cfg.Authenticator, cfg.Connections = held, guard
				}
				c.listener = func(net.Listener) net.Listener { return guard.Listener(lis) }
			})
			le := &loopbackEnv{env: e, addr: lis.Addr().String()}
			web := caclient.Request{Token: "ztunnel-token", Identity: spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web"), Impersonate: true}
			d := &trackingDialer{addr: le.addr}
			client := d.client(t, le)
			done := make(chan error, 1)
			go func() { _, err := client.CreateCertificate(ctxT(t), web); done <- err }()
			waitFor(t, "the request held in authentication", func() bool { return held.inFlight.Load() == 1 })
			clk.Step(deadline)
			waitFor(t, "the deadline's second timer", clk.HasWaiters)
			if tc.authBefore < 0 {
				clk.Step(deadline)
				waitFor(t, "the connection closed", func() bool { return d.closes.Load() == 1 })
				close(held.release)
				if err := <-done; err == nil {
					t.Fatal("the request on the closed connection was answered")
				}
				return
			}
			close(held.release)
			if err := <-done; err != nil {
				t.Fatalf("the request in flight at the deadline: %v", err)
			}
			clk.Step(deadline)
			if _, err := client.CreateCertificate(ctxT(t), web); err != nil {
				t.Fatal(err)
			}
			if d.dials.Load() != 1 || d.closes.Load() != 0 || guard.Open() != 0 {
				t.Errorf("dials %d, closes %d, watched %d; want the one connection kept", d.dials.Load(), d.closes.Load(), guard.Open())
			}
		})
	}
}

// One source address holds at most MaxPerAddress connections on which
// no caller has authenticated: one beyond is closed at once; a connection
// on which a caller authenticated no longer counts.
func TestUnauthenticatedConnectionsPerAddressBounded(t *testing.T) {
	const perAddr = 4
	le := newLoopbackEnv(t, 64, server.ConnGuardConfig{MaxPerAddress: perAddr})
	var idle []*idleConn
	for range perAddr {
		ic := le.openIdle(t)
		if ic == nil {
			t.Fatalf("connection %d of %d refused", len(idle)+1, perAddr)
		}
		idle = append(idle, ic)
	}
	if ic := le.openIdle(t); ic != nil {
		<-ic.gone // the handshake may end before the server reads its close
	}
	waitFor(t, "the connection beyond the bound closed", func() bool { return le.closed.count(server.ClosedPerAddress) == 1 })
	_ = idle[0].conn.Close()
	waitFor(t, "the closed connection forgotten", func() bool { return le.guard.Open() == perAddr-1 })
	web := caclient.Request{Token: "ztunnel-token", Identity: spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web"), Impersonate: true}
	d := &trackingDialer{addr: le.addr}
	if _, err := d.client(t, le).CreateCertificate(ctxT(t), web); err != nil {
		t.Fatalf("a ztunnel in the freed place: %v", err)
	}
	if ic := le.openIdle(t); ic == nil || le.guard.Open() != perAddr {
		t.Fatalf("after the ztunnel authenticated, another connection: %v, watched %d; want it accepted, %d watched", ic != nil, le.guard.Open(), perAddr)
	}
}
