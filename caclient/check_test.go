package caclient_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// Verify holds a leaf to what a workload's mTLS peers need of it: a chain
// to the roots usable for client and for server authentication, each.
func TestResultVerify(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P256)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := url.Parse("spiffe://cluster.local/ns/demo/sa/web")
	leaf := func(usages ...x509.ExtKeyUsage) *x509.Certificate {
		return testca.Sign(t, &x509.Certificate{SerialNumber: big.NewInt(7), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
			URIs: []*url.URL{id}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usages, BasicConstraintsValid: true},
			mid.Cert, key.Public(), mid.Key)
	}
	tests := []struct {
		name    string
		res     caclient.Result
		wantErr bool
	}{
		{name: "client and server authentication", res: caclient.Result{Leaf: leaf(x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth)}},
		{name: "server authentication only", res: caclient.Result{Leaf: leaf(x509.ExtKeyUsageServerAuth)}, wantErr: true},
		{name: "client authentication only", res: caclient.Result{Leaf: leaf(x509.ExtKeyUsageClientAuth)}, wantErr: true},
		{name: "another root", res: caclient.Result{Leaf: leaf(x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth), Roots: []*x509.Certificate{testca.NewRoot(t, testca.P256).Cert}}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.res
			r.Chain = []*x509.Certificate{mid.Cert}
			if r.Roots == nil {
				r.Roots = []*x509.Certificate{root.Cert}
			}
			if err := r.Verify(); (err != nil) != tt.wantErr {
				t.Fatalf("Verify() = %v, want error %v", err, tt.wantErr)
			}
		})
	}
}
