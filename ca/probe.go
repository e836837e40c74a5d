package ca

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"errors"
	"fmt"
	"time"
)

// ErrExpired is wrapped when the signing certificate, or a certificate of
// its chain up to the root, is no longer valid.
var ErrExpired = errors.New("signing certificate not valid now")

// Probe proves the CA can sign now: the signing certificate is within its
// validity, no certificate above it up to its root has expired, and the current key makes a signature that verifies (for a KMS
// or HSM key this reaches the device). Readiness checks call it, cached.
func (a *Authority) Probe(ctx context.Context) error {
	s := a.state.Load()
	now := a.cfg.Clock.Now()
	if err := checkChainValid(s, now); err != nil {
		return err
	}
	if now.Before(s.cert.NotBefore) || now.After(s.cert.NotAfter) {
		return fmt.Errorf("%w: valid %s to %s", ErrExpired, s.cert.NotBefore.Format(time.RFC3339), s.cert.NotAfter.Format(time.RFC3339))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	params, err := signatureParamsFor(s.signer.Public())
	if err != nil {
		return fmt.Errorf("probe signature: %w", err)
	}
	hash := params.hash
	msg := []byte("workload-ca readiness probe " + now.String())
	if hash != 0 {
		h := hash.New()
		h.Write(msg)
		msg = h.Sum(nil)
	}
	sig, err := s.signer.Sign(a.cfg.Rand, msg, hash)
	if err != nil {
		return fmt.Errorf("probe signature: %w", err)
	}
	if !verifyProbe(s.cert.PublicKey, hash, msg, sig) {
		return errors.New("probe signature does not verify with the signing certificate")
	}
	return nil
}

// verifyProbe checks the probe's signature as a certificate's would be:
// with the hash the leaf profile signs with for the key
// (signatureParamsFor).
func verifyProbe(pub crypto.PublicKey, hash crypto.Hash, digest, sig []byte) bool {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return ecdsa.VerifyASN1(k, digest, sig)
	case *rsa.PublicKey:
		return rsa.VerifyPKCS1v15(k, hash, digest, sig) == nil
	case ed25519.PublicKey:
		return ed25519.Verify(k, digest, sig)
	}
	return false
}
