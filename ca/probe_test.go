package ca_test

import (
	"context"
	"crypto"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
)

type brokenSigner struct{ crypto.Signer }

func (brokenSigner) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, errors.New("HSM unreachable")
}

func TestProbe(t *testing.T) {
	now := time.Now()
	for _, kt := range []testca.KeyType{testca.P256, testca.RSA2048, testca.Ed25519} {
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
