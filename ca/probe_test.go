package ca_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
)

type brokenSigner struct{ crypto.Signer }

// curveHashSigner signs only with the hash that matches its curve, as AWS,
// Google Cloud and Azure KMS do for ECDSA keys.
type curveHashSigner struct{ crypto.Signer }

func (s curveHashSigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	want := map[int]crypto.Hash{256: crypto.SHA256, 384: crypto.SHA384, 521: crypto.SHA512}[s.Public().(*ecdsa.PublicKey).Curve.Params().BitSize]
	if opts.HashFunc() != want {
		return nil, fmt.Errorf("KMS: this key signs %v digests only, not %v", want, opts.HashFunc())
	}
	return s.Signer.Sign(r, digest, opts)
}

func (brokenSigner) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, errors.New("HSM unreachable")
}

func TestProbe(t *testing.T) {
	now := time.Now()
	for _, kt := range []testca.KeyType{testca.P256, testca.P384, testca.RSA2048, testca.Ed25519} {
		t.Run(string(kt), func(t *testing.T) {
			clk := clocktesting.NewFakeClock(now)
			root := testca.NewRoot(t, kt, testca.Validity(now.Add(-time.Hour), now.Add(time.Hour)))
			a, err := ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local"), Clock: clk, MaxTTL: 30 * time.Minute}, root.Material())
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Probe(context.Background()); err != nil {
				t.Fatalf("Probe() = %v", err)
			}
			clk.Step(2 * time.Hour)
			if err := a.Probe(context.Background()); !errors.Is(err, ca.ErrExpired) {
				t.Fatalf("Probe() after expiry = %v, want ErrExpired", err)
			}
		})
	}
	for _, kt := range []testca.KeyType{testca.P256, testca.P384} {
		t.Run(string(kt)+" in a KMS that signs only its curve's hash", func(t *testing.T) {
			m := testca.NewRoot(t, kt).Material()
			m.Signer = curveHashSigner{m.Signer}
			a, err := ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local")}, m)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Probe(context.Background()); err != nil {
				t.Fatalf("Probe() = %v", err)
			}
		})
	}
	t.Run("key that cannot sign", func(t *testing.T) {
		root := testca.NewRoot(t, testca.P256)
		m := root.Material()
		m.Signer = brokenSigner{m.Signer}
		a, err := ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local")}, m)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Probe(context.Background()); err == nil {
			t.Fatal("Probe() = nil with a signer that fails")
		}
	})
}
