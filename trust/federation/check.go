package federation

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// ErrBundleRefused wraps every reason a peer's bundle is not taken.
var ErrBundleRefused = errors.New("federated bundle refused")

// ParseBundle parses a bundle of td from a bundle endpoint's body: a
// SPIFFE bundle, a JSON object. Its roots are not checked (CheckBundle).
func ParseBundle(td spiffeid.TrustDomain, raw []byte) (*spiffebundle.Bundle, error) {
	body := bytes.TrimLeft(raw, " \t\r\n")
	if len(body) == 0 || body[0] != '{' {
		return nil, fmt.Errorf("%w: the body is not a JSON object (it starts with %q)", ErrBundleRefused, body[:min(len(body), 16)])
	}
	b, err := spiffebundle.Parse(td, body)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBundleRefused, err)
	}
	return b, nil
}

// CheckBundle returns what of b, a peer's bundle, may be trusted at now,
// or why none of it may: b holds 1 to maxRoots X.509 authorities, each a
// CA certificate that may sign certificates (keyCertSign), self-signed
// ones with a signature that verifies, none twice and none with the
// certificate or public key of one of own (our roots: a peer has no
// business vouching with them). Expired authorities are dropped; a bundle
// with none left is refused. What is returned holds the X.509
// authorities, the refresh hint and the sequence number: JWT authorities
// are dropped (nothing here verifies JWT-SVIDs).
func CheckBundle(b *spiffebundle.Bundle, now time.Time, maxRoots int, own []*x509.Certificate) (*spiffebundle.Bundle, error) {
	roots := b.X509Authorities()
	switch {
	case len(roots) == 0:
		return nil, fmt.Errorf("%w: no X.509 authorities", ErrBundleRefused)
	case len(roots) > maxRoots:
		return nil, fmt.Errorf("%w: %d X.509 authorities, at most %d (maxRoots)", ErrBundleRefused, len(roots), maxRoots)
	}
	usable := make([]*x509.Certificate, 0, len(roots))
	for i, c := range roots {
		if err := checkRoot(c, roots[:i], own); err != nil {
			return nil, fmt.Errorf("%w: X.509 authority %d (%s): %w", ErrBundleRefused, i, describe(c), err)
		}
		if !now.After(c.NotAfter) {
			usable = append(usable, c)
		}
	}
	if len(usable) == 0 {
		return nil, fmt.Errorf("%w: every X.509 authority has expired", ErrBundleRefused)
	}
	out := spiffebundle.FromX509Authorities(b.TrustDomain(), usable)
	if h, ok := b.RefreshHint(); ok {
		out.SetRefreshHint(h)
	}
	if s, ok := b.SequenceNumber(); ok {
		out.SetSequenceNumber(s)
	}
	return out, nil
}

// checkRoot checks one X.509 authority of a peer's bundle; before are the
// ones ahead of it.
func checkRoot(c *x509.Certificate, before, own []*x509.Certificate) error {
	switch {
	case !c.BasicConstraintsValid || !c.IsCA:
		return errors.New("not a CA certificate")
	case c.KeyUsage&x509.KeyUsageCertSign == 0:
		return errors.New("its key usage does not allow signing certificates (no keyCertSign)")
	case bytes.Equal(c.RawSubject, c.RawIssuer) && c.CheckSignature(c.SignatureAlgorithm, c.RawTBSCertificate, c.Signature) != nil:
		return errors.New("self-issued, but its signature does not verify with its own key")
	}
	for _, o := range own {
		if c.Equal(o) || bytes.Equal(c.RawSubjectPublicKeyInfo, o.RawSubjectPublicKeyInfo) {
			return errors.New("it is, or has the key of, one of our own roots")
		}
	}
	for _, o := range before {
		if c.Equal(o) {
			return errors.New("listed twice")
		}
	}
	return nil
}

// describe names c in a log line: its subject, bounded (it is the peer's
// text), and its serial number.
func describe(c *x509.Certificate) string {
	s := c.Subject.String()
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return fmt.Sprintf("subject %q, serial %x", s, c.SerialNumber)
}
