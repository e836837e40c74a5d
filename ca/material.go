package ca

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"go.step.sm/crypto/keyutil"
)

// Validate reports whether m can sign at time now: every field is set, Cert
// is a CA certificate allowed to sign certificates, Signer is its key, Cert
// is within its validity period, and Cert chains through Intermediates to
// one of Roots. Every error wraps ErrInvalidMaterial.
func (m *Material) Validate(now time.Time) error {
	_, err := m.validate(now)
	return err
}

// validate is Validate, returning the chains from Cert to Roots.
func (m *Material) validate(now time.Time) ([][]*x509.Certificate, error) {
	if err := m.checkComplete(); err != nil {
		return nil, invalidMaterial("%v", err)
	}
	if err := checkCA(m.Cert); err != nil {
		return nil, invalidMaterial("signing certificate %s: %v", describe(m.Cert), err)
	}
	if m.Cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, invalidMaterial("signing certificate %s: key usage lacks certSign", describe(m.Cert))
	}
	if !keyutil.Equal(m.Cert.PublicKey, m.Signer.Public()) {
		return nil, invalidMaterial("signing key does not match the public key of signing certificate %s", describe(m.Cert))
	}
	if err := checkValidity(m.Cert, now); err != nil {
		return nil, invalidMaterial("signing certificate %s: %v", describe(m.Cert), err)
	}
	if err := m.checkIntermediates(); err != nil {
		return nil, err
	}
	for i, r := range m.Roots {
		if err := checkCA(r); err != nil {
			return nil, invalidMaterial("root %d %s: %v", i, describe(r), err)
		}
	}
	return m.verifyChain(now)
}

func (m *Material) checkComplete() error {
	switch {
	case m == nil:
		return errors.New("no material")
	case m.Signer == nil:
		return errors.New("no signing key")
	case m.Cert == nil:
		return errors.New("no signing certificate")
	case len(m.Roots) == 0:
		return errors.New("empty root bundle")
	case containsNil(m.Intermediates):
		return errors.New("nil intermediate certificate")
	case containsNil(m.Roots):
		return errors.New("nil root certificate")
	}
	return nil
}

// checkIntermediates requires CA certificates in chain order: each one
// issued the certificate before it (by name), so chains are sent in order
// and hold nothing unrelated.
func (m *Material) checkIntermediates() error {
	prev := m.Cert
	for i, c := range m.Intermediates {
		if err := checkCA(c); err != nil {
			return invalidMaterial("intermediate %d %s: %v", i, describe(c), err)
		}
		if !bytes.Equal(prev.RawIssuer, c.RawSubject) {
			return invalidMaterial("intermediate %d %s did not issue %s: intermediates must be in chain order, issuer first",
				i, describe(c), describe(prev))
		}
		prev = c
	}
	return nil
}

// verifyChain returns the chains from Cert to Roots at now. This, done
// once per material, is what lets the signing path skip chain building for
// leaves.
func (m *Material) verifyChain(now time.Time) ([][]*x509.Certificate, error) {
	chains, err := m.Cert.Verify(verifyOptions(m.Roots, m.Intermediates, now, x509.ExtKeyUsageAny))
	if err != nil {
		return nil, invalidMaterial("signing certificate %s does not chain to the root bundle: %v", describe(m.Cert), err)
	}
	return chains, nil
}

// verifyOptions verifies to roots, through intermediates, at now, for
// usages.
func verifyOptions(roots, intermediates []*x509.Certificate, now time.Time, usages ...x509.ExtKeyUsage) x509.VerifyOptions {
	opts := x509.VerifyOptions{Roots: x509.NewCertPool(), Intermediates: x509.NewCertPool(), CurrentTime: now, KeyUsages: usages}
	for _, r := range roots {
		opts.Roots.AddCert(r)
	}
	for _, c := range intermediates {
		opts.Intermediates.AddCert(c)
	}
	return opts
}

func checkCA(c *x509.Certificate) error {
	if !c.BasicConstraintsValid || !c.IsCA {
		return errors.New("not a CA certificate (basicConstraints CA=false or absent)")
	}
	return nil
}

func checkValidity(c *x509.Certificate, now time.Time) error {
	switch {
	case now.Before(c.NotBefore):
		return fmt.Errorf("not valid before %s", c.NotBefore.UTC().Format(time.RFC3339))
	case now.After(c.NotAfter):
		return fmt.Errorf("expired at %s", c.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

func invalidMaterial(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidMaterial, fmt.Sprintf(format, args...))
}

// describe names a certificate in error messages.
func describe(c *x509.Certificate) string {
	return fmt.Sprintf("(subject %q, serial %x)", c.Subject.String(), c.SerialNumber)
}

func containsNil(certs []*x509.Certificate) bool {
	for _, c := range certs {
		if c == nil {
			return true
		}
	}
	return false
}
