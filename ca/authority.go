package ca

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Authority issues X.509-SVIDs from the active CA material. It is safe for
// concurrent use; SetMaterial swaps the material without blocking signers.
type Authority struct {
	cfg   Config
	state atomic.Pointer[state]
	// templates recycles leaf templates (*x509.Certificate, over a KiB
	// each): x509.CreateCertificate keeps no reference to its template.
	templates sync.Pool
}

// state is everything the signing path needs, computed once per material
// and never mutated afterwards.
type state struct {
	signer crypto.Signer
	cert   *x509.Certificate
	// above is the certificates to send between a leaf and the root
	// bundle: the signing certificate unless it is a root, then the
	// intermediates.
	above    []*x509.Certificate
	abovePEM []string
	// roots and rootsPEM are the trust bundle; rootsPEM is one string with
	// every root concatenated, the last element of every chain.
	roots    []*x509.Certificate
	rootsPEM string
}

// New returns an Authority serving m. The material is validated against the
// configured clock and copied; later changes to m have no effect.
func New(cfg Config, m *Material) (*Authority, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	a := &Authority{cfg: cfg}
	a.templates.New = func() any { return new(x509.Certificate) }
	if err := a.SetMaterial(m); err != nil {
		return nil, err
	}
	return a, nil
}

// SetMaterial validates m and, if it is usable, makes it the active
// material atomically. On error the previous material keeps serving.
func (a *Authority) SetMaterial(m *Material) error {
	if err := m.Validate(a.cfg.Clock.Now()); err != nil {
		return err
	}
	if err := checkTrustDomain(m.Cert, a.cfg.TrustDomain); err != nil {
		return err
	}
	a.state.Store(newState(m))
	return nil
}

// Roots returns the trust bundle of the active material.
func (a *Authority) Roots() []*x509.Certificate {
	return slices.Clone(a.state.Load().roots)
}

// SigningCert returns the active signing certificate.
func (a *Authority) SigningCert() *x509.Certificate {
	return a.state.Load().cert
}

// newState precomputes the PEM elements of every chain the authority
// returns, so that signing never encodes or parses CA material.
func newState(m *Material) *state {
	s := &state{
		signer: m.Signer,
		cert:   m.Cert,
		roots:  slices.Clone(m.Roots),
	}
	if !containsCert(m.Roots, m.Cert) {
		s.above = append(s.above, m.Cert)
	}
	s.above = append(s.above, m.Intermediates...)
	s.abovePEM = make([]string, len(s.above))
	for i, c := range s.above {
		s.abovePEM[i] = encodeCert(c.Raw)
	}
	var b strings.Builder
	for _, r := range m.Roots {
		b.WriteString(encodeCert(r.Raw))
	}
	s.rootsPEM = b.String()
	return s
}

// checkTrustDomain refuses a signing certificate that names itself, with a
// SPIFFE URI SAN, as a CA of another trust domain.
func checkTrustDomain(cert *x509.Certificate, td spiffeid.TrustDomain) error {
	for _, u := range cert.URIs {
		id, err := spiffeid.FromURI(u)
		if err == nil && id.TrustDomain() != td {
			return fmt.Errorf("%w: signing certificate is for trust domain %q, not %q",
				ErrInvalidMaterial, id.TrustDomain(), td)
		}
	}
	return nil
}

func containsCert(certs []*x509.Certificate, c *x509.Certificate) bool {
	return slices.ContainsFunc(certs, func(x *x509.Certificate) bool {
		return bytes.Equal(x.Raw, c.Raw)
	})
}

// Intermediates returns the CA certificates sent between a leaf and the
// root bundle: the signing certificate unless it is a root, then its
// issuers up to the roots.
func (a *Authority) Intermediates() []*x509.Certificate {
	return slices.Clone(a.state.Load().above)
}
