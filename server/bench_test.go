package server_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/issuance"
	"github.com/workload-ca/workload-ca/proto/capb"
	"github.com/workload-ca/workload-ca/server"
)

// ztunnelRequest is what ztunnel sends for web, a workload on its node:
// a CSR and the ImpersonatedIdentity metadata.
func ztunnelRequest(tb testing.TB) *capb.IstioCertificateRequest {
	web := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	csr, _ := testca.ZtunnelCSR(tb, web)
	return &capb.IstioCertificateRequest{Csr: string(csr), ValidityDuration: 86400,
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			server.ImpersonatedIdentityKey: structpb.NewStringValue(web.String()),
		}}}
}

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
	svc, err := server.NewService(server.Config{Authenticator: testAuthenticator(), Authorizer: testPolicy(b),
		Pipeline: newPipeline(b, issuance.Config{Signer: authority, Audit: slog.New(slog.NewJSONHandler(io.Discard, nil))})})
	if err != nil {
		b.Fatal(err)
	}
	req := ztunnelRequest(b)
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
	req := ztunnelRequest(b)
	ctx := withToken(context.Background(), "ztunnel-token")
	clients := make(chan capb.IstioCertificateServiceClient, 4)
	for range cap(clients) {
		clients <- capb.NewIstioCertificateServiceClient(e.conn(b))
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
