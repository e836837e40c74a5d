package server_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/authz/authztest"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/proto/capb"
	"github.com/workload-ca/workload-ca/server"
)

// BenchmarkCreateCertificate is one ztunnel request through the service,
// without the transport: request checks, authentication (a cache hit),
// node-scoped authorization, signing and the JSON audit record. Compared
// with ca's BenchmarkSign plus BenchmarkParseCSR, it shows what the service
// adds to the crypto floor.
func BenchmarkCreateCertificate(b *testing.B) {
	authority, err := ca.New(ca.Config{TrustDomain: td}, testca.NewRoot(b, testca.P256).Material())
	if err != nil {
		b.Fatal(err)
	}
	policy := testPolicy(b)
	authn := &authztest.Authenticator{Callers: map[string]authz.Caller{
		"ztunnel-token": {Namespace: "istio-system", ServiceAccount: "ztunnel", PodName: "ztunnel-a", PodUID: "zt-a", NodeName: "node-a"},
	}}
	svc, err := server.NewService(server.Config{Authenticator: authn, Authorizer: policy, Signer: authority,
		Audit: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	web := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	csr, _ := testca.ZtunnelCSR(b, web)
	req := &capb.IstioCertificateRequest{Csr: string(csr), ValidityDuration: 86400,
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			server.ImpersonatedIdentityKey: structpb.NewStringValue(web.String()),
		}}}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer ztunnel-token"))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := svc.CreateCertificate(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGRPCParallel is ztunnels' requests through the whole server in
// process: TLS 1.3 over an in-memory connection, HTTP/2, the service and
// signing, with 8 requests in flight per core over 4 connections. The
// client sends one pregenerated CSR, so most of the CPU is the server's.
func BenchmarkGRPCParallel(b *testing.B) {
	e := newEnv(b, testca.NewRoot(b, testca.P256).Material())
	web := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	csr, _ := testca.ZtunnelCSR(b, web)
	req := &capb.IstioCertificateRequest{Csr: string(csr), ValidityDuration: 86400,
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			server.ImpersonatedIdentityKey: structpb.NewStringValue(web.String()),
		}}}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer ztunnel-token")
	clients := make(chan capb.IstioCertificateServiceClient, 4)
	for range cap(clients) {
		conn, err := grpc.NewClient("passthrough:///"+servingName, e.dialer(),
			grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: e.roots, ServerName: servingName, MinVersion: tls.VersionTLS13})))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		clients <- capb.NewIstioCertificateServiceClient(conn)
	}
	b.SetParallelism(8)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		c := <-clients
		clients <- c
		for pb.Next() {
			if _, err := c.CreateCertificate(ctx, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
