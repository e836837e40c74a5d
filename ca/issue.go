package ca

import (
	"crypto"
	"crypto/rsa"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// leafSpec is what one issued leaf must be: the parts that differ between a
// workload SVID (one SPIFFE ID) and a serving certificate (DNS names).
type leafSpec struct {
	pub         crypto.PublicKey
	id          spiffeid.ID // the only URI SAN; zero for serving certificates
	dnsNames    []string
	ttl         time.Duration // already clamped
	maxValidity time.Duration // of NotAfter - NotBefore; zero: unbounded
	extKeyUsage []x509.ExtKeyUsage
}

// serialAttempts bounds retries when the random source yields a zero serial.
const serialAttempts = 4

// issue encodes the leaf of spec, signs it with s, and verifies the
// result: the signature once, with the signing certificate's key (as
// x509.CreateCertificate would), and the parsed content against spec.
func (a *Authority) issue(s *state, spec *leafSpec) (*x509.Certificate, error) {
	f, err := a.fields(s, spec)
	if err != nil {
		return nil, err
	}
	buf := a.tbsBuffers.Get().(*[]byte)
	defer a.tbsBuffers.Put(buf)
	tbs, err := s.enc.appendTBS((*buf)[:0], &f)
	if err != nil {
		return nil, fmt.Errorf("ca: encoding the certificate: %w", err)
	}
	*buf = tbs
	signature, err := crypto.SignMessage(s.signer, a.cfg.Rand, tbs, s.enc.sig.hash)
	if err != nil {
		return nil, fmt.Errorf("ca: signing: %w", err)
	}
	der, err := s.enc.certificate(tbs, signature)
	if err != nil {
		return nil, fmt.Errorf("ca: encoding the certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("ca: parsing the issued certificate: %w", err)
	}
	if err := s.cert.CheckSignature(leaf.SignatureAlgorithm, leaf.RawTBSCertificate, leaf.Signature); err != nil {
		return nil, fmt.Errorf("%w: signature: %w", errIssuedInvalid, err)
	}
	if err := checkIssued(leaf, s.cert, s.expiring.NotAfter, spec); err != nil {
		return nil, err
	}
	return leaf, nil
}

// fields returns the content of the leaf of spec: empty subject (so the
// SAN extension is critical), a random serial, the names of spec, no CA
// rights, and a validity window inside the issuer's.
func (a *Authority) fields(s *state, spec *leafSpec) (leafFields, error) {
	notBefore, notAfter, err := a.validity(s, spec.ttl)
	if err != nil {
		return leafFields{}, err
	}
	if spec.maxValidity > 0 && notAfter.Sub(notBefore) > spec.maxValidity {
		notAfter = notBefore.Add(spec.maxValidity)
	}
	serial, err := randomSerial(a.cfg.Rand)
	if err != nil {
		return leafFields{}, err
	}
	spki, err := s.enc.marshalSPKI(spec.pub)
	if err != nil {
		return leafFields{}, fmt.Errorf("ca: encoding the public key: %w", err)
	}
	f := leafFields{
		serial:      serial,
		notBefore:   notBefore,
		notAfter:    notAfter,
		spki:        spki,
		keyUsage:    keyUsageFor(spec.pub),
		extKeyUsage: spec.extKeyUsage,
		dnsNames:    spec.dnsNames,
	}
	if !spec.id.IsZero() {
		f.uri = spec.id.String()
	}
	return f, nil
}

// validity returns NotBefore = now - Backdate and NotAfter = now + ttl,
// NotBefore kept inside the issuer's validity period and NotAfter no later
// than the first expiry of the issuer's chain (s.expiring): a leaf that
// outlived its intermediate or its root would stop verifying before its
// time.
func (a *Authority) validity(s *state, ttl time.Duration) (time.Time, time.Time, error) {
	now := a.cfg.Clock.Now()
	if err := checkChainValid(s, now); err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("ca: %w", err)
	}
	if err := checkValidity(s.cert, now); err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("ca: signing certificate %s: %w", describe(s.cert), err)
	}
	notBefore := now.Add(-a.cfg.Backdate)
	if notBefore.Before(s.cert.NotBefore) {
		notBefore = s.cert.NotBefore
	}
	notAfter := now.Add(ttl)
	if notAfter.After(s.expiring.NotAfter) {
		notAfter = s.expiring.NotAfter
	}
	return notBefore, notAfter, nil
}

// checkChainValid fails once a certificate of the signing chain has
// expired: every leaf signed then would fail to verify.
func checkChainValid(s *state, now time.Time) error {
	if now.After(s.expiring.NotAfter) {
		return fmt.Errorf("%w: %s of the signing chain expired at %s", ErrExpired, describe(s.expiring),
			s.expiring.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// randomSerial returns a uniformly random positive serial below 2^128.
func randomSerial(r io.Reader) (*big.Int, error) {
	var b [16]byte
	for range serialAttempts {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, fmt.Errorf("ca: serial number: %w", err)
		}
		if n := new(big.Int).SetBytes(b[:]); n.Sign() > 0 {
			return n, nil
		}
	}
	return nil, fmt.Errorf("ca: serial number: random source returned zero %d times", serialAttempts)
}

// keyUsageFor returns digitalSignature, plus keyEncipherment for RSA keys
// (RSA key transport in TLS 1.2); other key types cannot encipher.
func keyUsageFor(pub crypto.PublicKey) x509.KeyUsage {
	if _, ok := pub.(*rsa.PublicKey); ok {
		return x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	}
	return x509.KeyUsageDigitalSignature
}
