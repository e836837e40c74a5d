package server

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// splitListener hands the connections of one listener to two: to normal
// while fewer than busyAt client connections are open, to busy from then
// on. A connection stays with the listener that took it for as long as it
// lives; it counts as open until it is closed.
type splitListener struct {
	lis          net.Listener
	busyAt       int64
	open         atomic.Int64
	normal, busy *connQueue
	done         chan struct{} // closed when lis has failed
	err          error         // why; set before done is closed
	closing      sync.Once
}

func newSplitListener(lis net.Listener, busyAt int) *splitListener {
	s := &splitListener{lis: lis, busyAt: int64(busyAt), done: make(chan struct{})}
	s.normal, s.busy = s.queue(), s.queue()
	return s
}

func (s *splitListener) queue() *connQueue {
	return &connQueue{s: s, conns: make(chan net.Conn), closed: make(chan struct{})}
}

// run accepts connections until lis fails or both queues are closed.
// Temporary failures (too many open files) are retried after a pause, as
// grpc-go's own accept loop does.
func (s *splitListener) run() {
	var pause time.Duration
	for {
		c, err := s.lis.Accept()
		if err != nil {
			var ne interface{ Temporary() bool }
			if errors.As(err, &ne) && ne.Temporary() && !s.queuesClosed() {
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				time.Sleep(pause)
				continue
			}
			s.err = err
			close(s.done)
			return
		}
		pause = 0
		q := s.normal
		if s.open.Load() >= s.busyAt {
			q = s.busy
		}
		s.open.Add(1)
		q.hand(&countedConn{Conn: c, open: &s.open})
	}
}

func (s *splitListener) queuesClosed() bool {
	return isClosed(s.normal.closed) && isClosed(s.busy.closed)
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// queueClosed closes lis once both queues are closed, which ends run.
func (s *splitListener) queueClosed() {
	if s.queuesClosed() {
		s.closing.Do(func() { _ = s.lis.Close() })
	}
}

// connQueue is one side of a splitListener, as a net.Listener.
type connQueue struct {
	s         *splitListener
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
}

// hand gives c to the queue's server, or closes it if that has stopped.
func (q *connQueue) hand(c net.Conn) {
	select {
	case q.conns <- c:
	case <-q.closed:
		_ = c.Close()
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.closed:
		return nil, net.ErrClosed
	case <-q.s.done:
		return nil, q.s.err
	}
}

func (q *connQueue) Close() error {
	q.closeOnce.Do(func() { close(q.closed); q.s.queueClosed() })
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.s.lis.Addr() }

// countedConn counts itself out of the open connections when closed.
type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}
