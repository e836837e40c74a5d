package ca

import (
	"crypto"
	"crypto/rsa"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net/url"
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

// issue builds the template for spec, signs it with s, and verifies the
// result. x509.CreateCertificate already checks the signature it produced,
// so verification looks only at content.
func (a *Authority) issue(s *state, spec *leafSpec) (*x509.Certificate, error) {
	tmpl := a.templates.Get().(*x509.Certificate)
	defer func() {
		*tmpl = x509.Certificate{} // the pool must not keep the request's key alive
		a.templates.Put(tmpl)
	}()
	if err := a.template(s.cert, spec, tmpl); err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(a.cfg.Rand, tmpl, s.cert, spec.pub, s.signer)
	if err != nil {
		return nil, fmt.Errorf("ca: signing: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("ca: parsing the issued certificate: %w", err)
	}
	if err := checkIssued(leaf, s.cert, spec); err != nil {
		return nil, err
	}
	return leaf, nil
}

// template fills t with the leaf template: empty subject (so Go marks the
// SAN extension critical), a random serial, the names of spec, no CA
// rights, and a validity window inside the issuer's.
func (a *Authority) template(issuer *x509.Certificate, spec *leafSpec, t *x509.Certificate) error {
	notBefore, notAfter, err := a.validity(issuer, spec.ttl)
	if err != nil {
		return err
	}
	if spec.maxValidity > 0 && notAfter.Sub(notBefore) > spec.maxValidity {
		notAfter = notBefore.Add(spec.maxValidity)
	}
	serial, err := randomSerial(a.cfg.Rand)
	if err != nil {
		return err
	}
	*t = x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		BasicConstraintsValid: true,
		KeyUsage:              keyUsageFor(spec.pub),
		ExtKeyUsage:           spec.extKeyUsage,
		AuthorityKeyId:        issuer.SubjectKeyId,
		DNSNames:              spec.dnsNames,
	}
	if !spec.id.IsZero() {
		t.URIs = []*url.URL{spec.id.URL()}
	}
	return nil
}

// validity returns NotBefore = now - Backdate and NotAfter = now + ttl,
// both kept inside the issuer's validity period.
func (a *Authority) validity(issuer *x509.Certificate, ttl time.Duration) (time.Time, time.Time, error) {
	now := a.cfg.Clock.Now()
	if err := checkValidity(issuer, now); err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("ca: signing certificate %s: %w", describe(issuer), err)
	}
	notBefore := now.Add(-a.cfg.Backdate)
	if notBefore.Before(issuer.NotBefore) {
		notBefore = issuer.NotBefore
	}
	notAfter := now.Add(ttl)
	if notAfter.After(issuer.NotAfter) {
		notAfter = issuer.NotAfter
	}
	return notBefore, notAfter, nil
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
