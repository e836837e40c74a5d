package server

import (
	"errors"
	"net"
	"testing"
)

// pipeListener accepts the server ends of net.Pipe pairs sent on conns.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { close(l.closed); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{} }

// A connection goes to the busy side while at least busyAt are open and
// to the normal side otherwise, however many came and went before it; a
// connection closed twice counts out once; when both sides are closed the
// listener below is closed too.
func TestSplitListener(t *testing.T) {
	lis := &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
	s := newSplitListener(lis, 2)
	go s.run()
	connect := func() net.Conn {
		server, client := net.Pipe()
		t.Cleanup(func() { _ = client.Close() })
		lis.conns <- server
		return server
	}
	steps := []struct {
		name  string
		close int // connections to close first, oldest first
		want  *connQueue
	}{
		{"first", 0, s.normal},
		{"second", 0, s.normal},
		{"third, with two open", 0, s.busy},
		{"fourth, with three open", 0, s.busy},
		{"after one closed, three open", 1, s.busy},
		{"after two more closed, two open", 2, s.busy},
		{"after two more closed, one open", 2, s.normal},
	}
	var open []net.Conn
	for _, st := range steps {
		for range st.close {
			_ = open[0].Close()
			_ = open[0].Close() // counted out once
			open = open[1:]
		}
		connect()
		var c net.Conn
		select {
		case c = <-s.normal.conns:
			if st.want != s.normal {
				t.Fatalf("%s: went to the normal side, want busy", st.name)
			}
		case c = <-s.busy.conns:
			if st.want != s.busy {
				t.Fatalf("%s: went to the busy side, want normal", st.name)
			}
		}
		open = append(open, c)
	}
	if got := s.open.Load(); got != int64(len(open)) {
		t.Errorf("%d connections counted open, want %d", got, len(open))
	}
	_ = s.normal.Close()
	select {
	case <-lis.closed:
		t.Fatal("listener closed with one side still open")
	default:
	}
	_ = s.busy.Close()
	<-lis.closed
	<-s.done
	if !errors.Is(s.err, net.ErrClosed) {
		t.Errorf("run ended with %v, want the listener's net.ErrClosed", s.err)
	}
	if _, err := s.normal.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept on a closed side = %v, want net.ErrClosed", err)
	}
}
