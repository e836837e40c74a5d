package ca_test

import (
	"context"
	"testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func BenchmarkSign(b *testing.B) {
	for _, kt := range []testca.KeyType{testca.P256, testca.RSA2048} {
		b.Run(string(kt)+" CA", func(b *testing.B) {
			a := newAuthority(b, testca.NewRoot(b, kt).Material(), testNow())
			csrPEM, _ := testca.ZtunnelCSR(b, workload)
			req := ca.Request{CSR: parseCSR(b, csrPEM), ID: workload}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := a.Sign(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkParseCSR(b *testing.B) {
	csrPEM, _ := testca.ZtunnelCSR(b, workload)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ca.ParseCSR(csrPEM); err != nil {
			b.Fatal(err)
		}
	}
}
