package ca

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"
)

// ErrExpired is wrapped when the signing certificate is no longer valid.
var ErrExpired = errors.New("signing certificate not valid now")

// Probe proves the CA can sign now: the signing certificate is within its
// validity, and the current key makes a signature that verifies (for a KMS
// or HSM key this reaches the device). Readiness checks call it, cached.
func (a *Authority) Probe(ctx context.Context) error {
	s := a.state.Load()
	now := a.cfg.Clock.Now()
	if now.Before(s.cert.NotBefore) || now.After(s.cert.NotAfter) {
		return fmt.Errorf("%w: valid %s to %s", ErrExpired, s.cert.NotBefore.Format(time.RFC3339), s.cert.NotAfter.Format(time.RFC3339))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	digest := sha256.Sum256([]byte("workload-ca readiness probe " + now.String()))
	opts, msg := crypto.SignerOpts(crypto.SHA256), digest[:]
	if _, ok := s.signer.Public().(ed25519.PublicKey); ok {
		opts, msg = crypto.Hash(0), []byte("workload-ca readiness probe")
	}
	sig, err := s.signer.Sign(a.cfg.Rand, msg, opts)
	if err != nil {
		return fmt.Errorf("probe signature: %w", err)
	}
	if !verifyProbe(s.cert.PublicKey, msg, sig) {
		return errors.New("probe signature does not verify with the signing certificate")
	}
	return nil
}

func verifyProbe(pub crypto.PublicKey, msg, sig []byte) bool {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return ecdsa.VerifyASN1(k, msg, sig)
	case *rsa.PublicKey:
		return rsa.VerifyPKCS1v15(k, crypto.SHA256, msg, sig) == nil
	case ed25519.PublicKey:
		return ed25519.Verify(k, msg, sig)
	}
	return false
}
