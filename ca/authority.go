package ca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"math/big"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Authority issues X.509-SVIDs from the active CA material. It is safe for
// concurrent use; SetMaterial swaps the material without blocking signers.
type Authority struct {
	cfg   Config
	state atomic.Pointer[state]
	// mu orders the writers of state (SetMaterial, SetPeerRoots); peers is
	// the PEM of the peer roots, appended to every answer's root element.
	mu    sync.Mutex
	peers string
	// tbsBuffers recycles the buffers leaves are encoded in (*[]byte): the
	// signature and the certificate copy what they need.
	tbsBuffers sync.Pool
}

// state is everything the signing path needs, computed once per material
// and never mutated afterwards.
type state struct {
	signer crypto.Signer
	enc    *leafEncoder
	cert   *x509.Certificate
	// expiring is the certificate of the signing chain (cert, the
	// certificates above it, the root it verifies to) that expires first:
	// no leaf outlives it, and the CA cannot sign once it has expired.
	expiring *x509.Certificate
	// above is the certificates to send between a leaf and the root
	// bundle: the signing certificate unless it is a root, then the
	// intermediates.
	above    []*x509.Certificate
	abovePEM []string
	// roots and rootsPEM are the trust bundle; rootsPEM is one string with
	// every root concatenated. answerPEM, the last element of every chain,
	// is rootsPEM and the peer roots (SetPeerRoots).
	roots     []*x509.Certificate
	rootsPEM  string
	answerPEM string
}

// New returns an Authority serving m. The material is validated against the
// configured clock and copied; later changes to m have no effect.
func New(cfg Config, m *Material) (*Authority, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	a := &Authority{cfg: cfg}
	a.tbsBuffers.New = func() any { b := make([]byte, 0, 1024); return &b }
	if err := a.SetMaterial(m); err != nil {
		return nil, err
	}
	return a, nil
}

// SetMaterial validates m and, if it is usable, makes it the active
// material atomically. On error the previous material keeps serving.
func (a *Authority) SetMaterial(m *Material) error {
	chains, err := m.validate(a.cfg.Clock.Now())
	if err != nil {
		return err
	}
	if err := checkTrustDomain(m.Cert, a.cfg.TrustDomain); err != nil {
		return err
	}
	s, err := newState(m)
	if err != nil {
		return err
	}
	s.expiring = firstExpiring(chains)
	if err := a.checkLeafChain(s, m); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s.answerPEM = s.rootsPEM + a.peers
	a.state.Store(s)
	return nil
}

// checkLeafChain verifies that a leaf the signing certificate issues
// verifies through m's intermediates to its roots, for client and for
// server authentication. Validate only checks that the signing certificate
// chains as an end entity; the constraints the certificates above it place
// on the certificates below it (a path length of 0 in an enterprise CA
// above Istio's ca-cert.pem, name constraints, extended key usages) only
// show with a leaf. The signing path then skips chain building.
//
// The leaf is signed by a throwaway key standing in for the CA's in a copy
// of the signing certificate (chain building checks each signature with
// the issuer's parsed public key, and the copy's own signature with its
// unchanged raw bytes), so loading material never reaches a KMS or HSM:
// Probe checks the key.
func (a *Authority) checkLeafChain(s *state, m *Material) error {
	stand, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("ca: chain check key: %w", err)
	}
	signing := *m.Cert
	signing.PublicKey = stand.Public()
	id, err := spiffeid.FromSegments(a.cfg.TrustDomain, "workload-ca", "chain-check")
	if err != nil {
		return err
	}
	now := a.cfg.Clock.Now()
	tmpl := &x509.Certificate{
		// Valid now, which is all chain verification at now asks of it.
		SerialNumber: big.NewInt(1), NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Minute),
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage:    svidExtKeyUsage(),
		AuthorityKeyId: signing.SubjectKeyId, URIs: []*url.URL{id.URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, &signing, stand.Public(), stand)
	if err != nil {
		return fmt.Errorf("ca: chain check leaf: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return fmt.Errorf("ca: chain check leaf: %w", err)
	}
	standIn := func(certs []*x509.Certificate) []*x509.Certificate {
		out := slices.Clone(certs)
		for i, c := range out {
			if c.Equal(m.Cert) {
				out[i] = &signing
			}
		}
		return out
	}
	opts := verifyOptions(standIn(m.Roots), standIn(s.above), now)
	// One usage at a time: crypto/x509 accepts a chain that allows any one
	// of KeyUsages.
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
		opts.KeyUsages = []x509.ExtKeyUsage{usage}
		if _, err := leaf.Verify(opts); err != nil {
			return invalidMaterial("a leaf signed by %s would not verify to the root bundle (a constraint of a CA above it?): %v", describe(m.Cert), err)
		}
	}
	return nil
}

// firstExpiring returns the certificate that expires first in the chain
// from the signing certificate to its root (chains, as Validate built
// them): a leaf verifies only while every certificate of its chain is
// valid. When it chains to several roots (a root cross-signed), the chain
// that lasts longest counts.
func firstExpiring(chains [][]*x509.Certificate) *x509.Certificate {
	var best *x509.Certificate
	for _, chain := range chains {
		first := chain[0]
		for _, c := range chain[1:] {
			if c.NotAfter.Before(first.NotAfter) {
				first = c
			}
		}
		if best == nil || first.NotAfter.After(best.NotAfter) {
			best = first
		}
	}
	return best
}

// ChainNotAfter returns when the first certificate of the active signing
// chain (the signing certificate, the certificates above it, its root)
// expires, and that certificate: the CA signs nothing valid after it.
func (a *Authority) ChainNotAfter() (time.Time, *x509.Certificate) {
	c := a.state.Load().expiring
	return c.NotAfter, c
}

// SetPeerRoots sets the roots of other trust domains (federation) that
// every answer's root element carries after the CA's own: a peer that
// verifies with that element then trusts them too. Roots() is unchanged:
// they are not this CA's.
func (a *Authority) SetPeerRoots(roots []*x509.Certificate) {
	var b strings.Builder
	for _, r := range roots {
		b.WriteString(encodeCert(r.Raw))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.peers = b.String()
	next := *a.state.Load()
	next.answerPEM = next.rootsPEM + a.peers
	a.state.Store(&next)
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
func newState(m *Material) (*state, error) {
	enc, err := newLeafEncoder(m.Cert, m.Signer.Public())
	if err != nil {
		return nil, invalidMaterial("signing key: %v", err)
	}
	s := &state{
		enc:    enc,
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
	return s, nil
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
