package ca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"testing"

	"golang.org/x/crypto/cryptobyte"
)

// The encoder writes some parts of a leaf from bytes encoded once; each
// must be what encoding them then and there gives.

func TestMarshalSPKIIsWhatX509Marshals(t *testing.T) {
	enc := newTestEncoder(t)
	ec := func(c elliptic.Curve) func() (crypto.PublicKey, error) {
		return func() (crypto.PublicKey, error) {
			k, err := ecdsa.GenerateKey(c, rand.Reader)
			return k.Public(), err
		}
	}
	for _, tt := range []struct {
		name string
		key  func() (crypto.PublicKey, error)
	}{
		{"P-256", ec(elliptic.P256())},
		{"P-384", ec(elliptic.P384())},
		{"P-521, no prefix", ec(elliptic.P521())},
		{"P-224, no prefix", ec(elliptic.P224())},
		{"RSA", func() (crypto.PublicKey, error) {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			return k.Public(), err
		}},
		{"Ed25519", func() (crypto.PublicKey, error) {
			pub, _, err := ed25519.GenerateKey(rand.Reader)
			return pub, err
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pub, err := tt.key()
			if err != nil {
				t.Fatal(err)
			}
			want, err := x509.MarshalPKIXPublicKey(pub)
			if err != nil {
				t.Fatal(err)
			}
			got, err := enc.marshalSPKI(pub)
			if err != nil {
				t.Fatalf("marshalSPKI: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("marshalSPKI =\n%x\nx509.MarshalPKIXPublicKey =\n%x", got, want)
			}
		})
	}
}

func TestEncodedUsagesAreWhatTheEncoderWrites(t *testing.T) {
	enc := newTestEncoder(t)
	tests := []struct {
		name string
		ku   x509.KeyUsage
		eku  []x509.ExtKeyUsage
	}{
		{"SVID, ECDSA or Ed25519 key", x509.KeyUsageDigitalSignature, svidExtKeyUsage()},
		{"SVID, RSA key", x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, svidExtKeyUsage()},
		{"serving, ECDSA key", x509.KeyUsageDigitalSignature, servingExtKeyUsage()},
		{"serving, RSA key", x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, servingExtKeyUsage()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := enc.encodedUsage(tt.ku, tt.eku)
			if !ok {
				t.Fatal("not encoded in advance")
			}
			var b cryptobyte.Builder
			addUsageExtensions(&b, tt.ku, tt.eku)
			want, err := b.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encoded in advance\n%x\nencoded now\n%x", got, want)
			}
		})
	}
	if _, ok := enc.encodedUsage(x509.KeyUsageDigitalSignature, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}); ok {
		t.Fatal("a profile the CA does not issue was encoded in advance")
	}
}

// newTestEncoder returns the encoder of a P-256 signing certificate; of
// the certificate, the encoder reads only its subject and key identifier.
func newTestEncoder(t *testing.T) *leafEncoder {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	issuer := &x509.Certificate{RawSubject: []byte{0x30, 0x00}, SubjectKeyId: []byte{1, 2, 3, 4}}
	enc, err := newLeafEncoder(issuer, key.Public())
	if err != nil {
		t.Fatal(err)
	}
	return enc
}
