package ca_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func FuzzParseCSR(f *testing.F) {
	ztunnel, _ := testca.ZtunnelCSR(f, workload)
	f.Add(ztunnel)
	f.Add(testca.CSR(f, testca.NewKey(f, testca.RSA2048), workload.String()))
	f.Add(testca.CSR(f, testca.NewKey(f, testca.Ed25519)))
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nZ2FyYmFnZQ==\n-----END CERTIFICATE REQUEST-----\n"))
	f.Add([]byte("garbage"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		csr, err := ca.ParseCSR(in)
		if err != nil {
			if !errors.Is(err, ca.ErrInvalidCSR) {
				t.Fatalf("error does not wrap ErrInvalidCSR: %v", err)
			}
			return
		}
		if err := csr.CheckSignature(); err != nil {
			t.Fatalf("accepted a CSR with a bad signature: %v", err)
		}
		if !allowedKey(csr.PublicKey) {
			t.Fatalf("accepted a CSR with key %T", csr.PublicKey)
		}
		if len(csr.URIs) > 1 || len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses) > 0 {
			t.Fatalf("accepted a CSR with SANs %v %v %v %v", csr.URIs, csr.DNSNames, csr.IPAddresses, csr.EmailAddresses)
		}
	})
}

func allowedKey(pub any) bool {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return k.Curve == elliptic.P256() || k.Curve == elliptic.P384()
	case *rsa.PublicKey:
		return k.N.BitLen() >= 2048 && k.N.BitLen() <= 8192
	case ed25519.PublicKey:
		return true
	}
	return false
}
