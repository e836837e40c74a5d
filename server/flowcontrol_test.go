package server_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/proto/capb"
)

// A client with fixed windows (as ztunnel's is) gets no PING frames from
// the server however many requests it sends: the server's windows are fixed
// too, so it does not probe the connection's bandwidth with pings.
func TestServerSendsNoFlowControlPings(t *testing.T) {
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material())
	var pings, frames atomic.Int64
	creds := frameTap{
		TransportCredentials: credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: e.roots, ServerName: servingName}),
		onFrame: func(f http2.Frame) {
			frames.Add(1)
			if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
				pings.Add(1)
			}
		},
	}
	conn, err := grpc.NewClient("passthrough:///"+servingName, grpc.WithTransportCredentials(creds), e.dialer(),
		grpc.WithStaticStreamWindowSize(2<<20), grpc.WithStaticConnWindowSize(5<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := capb.NewIstioCertificateServiceClient(conn)
	req := ztunnelRequest(t)
	ctx := withToken(ctxT(t), "ztunnel-token")
	const n = 50
	for range n {
		if _, err := c.CreateCertificate(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if got := frames.Load(); got < 3*n { // headers, data and trailers of each answer
		t.Fatalf("the tap saw %d frames for %d answers: it is not reading the connection", got, n)
	}
	if got := pings.Load(); got != 0 {
		t.Errorf("server sent %d PING frames over %d requests, want 0", got, n)
	}
}

// frameTap is TLS client credentials that decode the HTTP/2 frames the
// server sends, after decryption, and hand them to onFrame.
type frameTap struct {
	credentials.TransportCredentials
	onFrame func(http2.Frame)
}

func (f frameTap) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := f.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		fr := http2.NewFramer(io.Discard, pr)
		for {
			frame, err := fr.ReadFrame()
			if err != nil {
				_ = pr.CloseWithError(err) // unblocks the connection's reads
				return
			}
			f.onFrame(frame)
		}
	}()
	return &tappedConn{Conn: conn, tap: pw}, info, nil
}

func (f frameTap) Clone() credentials.TransportCredentials {
	return frameTap{TransportCredentials: f.TransportCredentials.Clone(), onFrame: f.onFrame}
}

// tappedConn copies what it reads to tap.
type tappedConn struct {
	net.Conn
	tap *io.PipeWriter
}

func (c *tappedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		_, _ = c.tap.Write(b[:n]) // a closed tap only stops counting
	}
	return n, err
}

func (c *tappedConn) Close() error {
	_ = c.tap.Close()
	return c.Conn.Close()
}
