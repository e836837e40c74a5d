package server

import (
	"context"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/peer"
	"k8s.io/utils/clock"
)

// DefaultAuthDeadline is how long a client connection may stay open
// without a request whose caller authenticated. ztunnel and istio-agent
// connect to the CA to send a CSR and send it at once; a request that
// authenticates takes a TLS handshake (at most DefaultHandshakeTimeout)
// and a token review (at most its 10 s timeout), so 30 s leaves them room
// twice over. A connection closed this way costs its client a reconnect.
const DefaultAuthDeadline = 30 * time.Second

// Reasons a ConnGuard closes a connection, as its ConnObserver hears them.
const (
	ClosedAuthDeadline = "auth-deadline"
	ClosedPerAddress   = "per-address"
)

// ConnObserver is told of every connection a ConnGuard closes, for
// metrics; reason is one of the Closed* reasons.
type ConnObserver interface {
	ConnectionClosed(reason string)
}

// ConnGuardConfig configures a ConnGuard.
type ConnGuardConfig struct {
	// Deadline closes a connection on which no request's caller has
	// authenticated within this long of its being accepted. Requests
	// still in flight then get as long again to end. Zero: never.
	Deadline time.Duration
	// MaxPerAddress bounds the connections of one source address on
	// which no caller has authenticated yet: one beyond is closed as soon
	// as it is accepted. Zero: no bound.
	MaxPerAddress int
	Observer      ConnObserver
	Clock         clock.WithDelayedExecution
}

// ConnGuard bounds what a client that never authenticates can hold.
// Every client takes one of the listener's connection slots
// (LimitConnections) before any check runs, and grpc-go closes a
// connection only once it has had no request for MaxConnectionIdle (15
// minutes): one client could hold every slot that long. With a guard, a
// connection on which no caller authenticated is closed after Deadline,
// and one source address holds at most MaxPerAddress such connections.
// Once a caller has authenticated on a connection, the guard leaves it to
// the Transport's limits.
//
// The guard wraps the listener (Listener) and hears of each request from
// the Service (Config.Connections), which it matches to its connection by
// the request's local and remote addresses (unique among open TCP
// connections).
type ConnGuard struct {
	deadline time.Duration
	perAddr  int
	obs      ConnObserver
	clock    clock.WithDelayedExecution

	mu    sync.Mutex
	conns map[connKey]*guardedConn
	// pending counts the connections of each source address on which no
	// caller has authenticated yet.
	pending map[string]int
}

type connKey struct{ local, remote string }

// NewConnGuard returns a guard; with neither bound set it guards nothing.
func NewConnGuard(cfg ConnGuardConfig) *ConnGuard {
	g := &ConnGuard{deadline: cfg.Deadline, perAddr: cfg.MaxPerAddress, obs: cfg.Observer, clock: cfg.Clock,
		conns: map[connKey]*guardedConn{}, pending: map[string]int{}}
	if g.obs == nil {
		g.obs = nopConnObserver{}
	}
	if g.clock == nil {
		g.clock = clock.RealClock{}
	}
	return g
}

// Listener returns lis with the connections it accepts guarded. Wrap the
// listener that holds the connection slots (LimitConnections), so that a
// connection the guard closes frees its slot.
func (g *ConnGuard) Listener(lis net.Listener) net.Listener {
	if g == nil || (g.deadline <= 0 && g.perAddr <= 0) {
		return lis
	}
	return &guardListener{Listener: lis, g: g}
}

type guardListener struct {
	net.Listener
	g *ConnGuard
}

// Accept returns the next connection the guard admits, closing those
// beyond the per-address bound.
func (l *guardListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := l.g.admit(c); gc != nil {
			return gc, nil
		}
		_ = c.Close()
		l.g.obs.ConnectionClosed(ClosedPerAddress)
	}
}

// guardedConn is a connection the guard watches until a caller
// authenticates on it or it closes. Its fields are guarded by g.mu.
type guardedConn struct {
	net.Conn
	g       *ConnGuard
	key     connKey
	source  string
	timer   clock.Timer
	flight  int  // requests in flight
	authed  bool // a caller has authenticated
	settled bool // no longer counted against its source, nor timed
	expired bool // the deadline has passed once
	closing bool // the guard has closed it, or it was closed
}

// admit returns c guarded, or nil if its source address has as many
// unauthenticated connections as it may.
func (g *ConnGuard) admit(c net.Conn) net.Conn {
	key := connKey{local: c.LocalAddr().String(), remote: c.RemoteAddr().String()}
	gc := &guardedConn{Conn: c, g: g, key: key, source: sourceOf(c.RemoteAddr())}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.perAddr > 0 && g.pending[gc.source] >= g.perAddr {
		return nil
	}
	if _, dup := g.conns[key]; dup {
		return c // not a TCP connection: nothing to match requests to
	}
	g.conns[key] = gc
	g.pending[gc.source]++
	if g.deadline > 0 {
		gc.timer = g.after(gc.deadlinePassed)
	}
	return gc
}

// after calls f once the deadline has passed, on a goroutine of its own
// (a fake clock calls back with its lock held, which Stop takes).
func (g *ConnGuard) after(f func()) clock.Timer {
	return g.clock.AfterFunc(g.deadline, func() { go f() })
}

// sourceOf is the address a connection comes from, without its port.
func sourceOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}

// RequestStarted is told of a request on a client connection; the
// function it returns, when the request ends, whether its caller
// authenticated.
func (g *ConnGuard) RequestStarted(ctx context.Context) func(authenticated bool) {
	p, ok := peer.FromContext(ctx)
	if g == nil || !ok || p.Addr == nil || p.LocalAddr == nil {
		return nopRequestDone
	}
	g.mu.Lock()
	c := g.conns[connKey{local: p.LocalAddr.String(), remote: p.Addr.String()}]
	if c == nil || c.settled {
		g.mu.Unlock()
		return nopRequestDone
	}
	c.flight++
	g.mu.Unlock()
	return func(authenticated bool) { g.requestDone(c, authenticated) }
}

func nopRequestDone(bool) {}

// requestDone settles c once a caller authenticated on it, or closes it if
// its deadline has passed and no request is left in flight.
func (g *ConnGuard) requestDone(c *guardedConn, authenticated bool) {
	g.mu.Lock()
	c.flight--
	if authenticated {
		c.authed = true
		g.settle(c)
	}
	late := c.expired && !c.settled && c.flight == 0 && !c.closing
	if late {
		c.closing = true
	}
	g.mu.Unlock()
	if late {
		g.closeLate(c)
	}
}

// deadlinePassed closes c unless a caller authenticated on it; requests in
// flight get as long again to end (and a caller of theirs to
// authenticate), after which c is closed whatever is in flight.
func (c *guardedConn) deadlinePassed() {
	g := c.g
	g.mu.Lock()
	if c.settled || c.closing {
		g.mu.Unlock()
		return
	}
	if c.flight > 0 && !c.expired {
		c.expired = true
		c.timer = g.after(c.deadlinePassed)
		g.mu.Unlock()
		return
	}
	c.expired, c.closing = true, true
	g.mu.Unlock()
	g.closeLate(c)
}

func (g *ConnGuard) closeLate(c *guardedConn) {
	_ = c.Close()
	g.obs.ConnectionClosed(ClosedAuthDeadline)
}

// settle stops watching c, under g.mu: it no longer counts against its
// source address nor has a deadline.
func (g *ConnGuard) settle(c *guardedConn) {
	if c.settled {
		return
	}
	c.settled = true
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if g.pending[c.source]--; g.pending[c.source] <= 0 {
		delete(g.pending, c.source)
	}
}

// Close forgets c and closes it.
func (c *guardedConn) Close() error {
	g := c.g
	g.mu.Lock()
	if g.conns[c.key] == c {
		delete(g.conns, c.key)
	}
	g.settle(c)
	c.closing = true
	g.mu.Unlock()
	return c.Conn.Close()
}

// Open is the number of connections the guard watches: those open on
// which no caller has authenticated yet.
func (g *ConnGuard) Open() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, c := range g.conns {
		if !c.settled {
			n++
		}
	}
	return n
}

type nopConnObserver struct{}

func (nopConnObserver) ConnectionClosed(string) {}
