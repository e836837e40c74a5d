package ca

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TTL is the lifetime a request asking for requested gets: the default
// for zero or less, at most the maximum.
func (a *Authority) TTL(requested time.Duration) time.Duration { return a.cfg.clampTTL(requested) }

// Sign issues an X.509-SVID for r.ID to the key of r.CSR, in three steps:
// build the template, sign it, verify what was signed. The CSR must come
// from ParseCSR. Errors wrap ErrInvalidCSR when the CSR does not fit the
// identity and ErrForeignTrustDomain when the identity is not ours; any
// other error is the CA's own failure.
func (a *Authority) Sign(ctx context.Context, r Request) (*Issued, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := a.checkRequest(r); err != nil {
		return nil, err
	}
	s := a.state.Load()
	ttl := a.cfg.clampTTL(r.TTL)
	if r.MaxTTL > 0 && ttl > r.MaxTTL {
		ttl = r.MaxTTL
	}
	leaf, err := a.issue(s, &leafSpec{
		pub:         r.CSR.PublicKey,
		id:          r.ID,
		ttl:         ttl,
		maxValidity: r.MaxValidity,
		extKeyUsage: svidExtKeyUsage(),
	})
	if err != nil {
		return nil, err
	}
	chain := make([]string, 0, len(s.abovePEM)+2)
	chain = append(chain, encodeCert(leaf.Raw))
	chain = append(chain, s.abovePEM...)
	chain = append(chain, s.answerPEM)
	return &Issued{Cert: leaf, Chain: chain}, nil
}

// checkRequest checks that the request can be granted: the identity is in
// our trust domain and the CSR, if it names an identity, names this one.
func (a *Authority) checkRequest(r Request) error {
	if r.CSR == nil {
		return invalidCSR("no CSR in the request")
	}
	if !r.ID.MemberOf(a.cfg.TrustDomain) {
		return fmt.Errorf("%w: %q is not in trust domain %q", ErrForeignTrustDomain, r.ID, a.cfg.TrustDomain)
	}
	if err := CheckPublicKey(r.CSR.PublicKey); err != nil {
		return err
	}
	switch len(r.CSR.URIs) {
	case 0:
		return nil
	case 1:
		id, err := spiffeid.FromURI(r.CSR.URIs[0])
		if err != nil || id != r.ID {
			return invalidCSR("URI SAN %q does not match the granted identity %q", r.CSR.URIs[0], r.ID)
		}
		return nil
	default:
		return invalidCSR("%d URI SANs, at most one is allowed", len(r.CSR.URIs))
	}
}

// IssueServing issues a TLS server certificate for the CA's own endpoint to
// pub, valid for dnsNames. It returns the leaf and the certificates to send
// above it (the signing certificate unless it is a root, then the
// intermediates), ready for a tls.Certificate. The lifetime is clamped like
// Sign's.
func (a *Authority) IssueServing(ctx context.Context, pub crypto.PublicKey, dnsNames []string, ttl time.Duration) (*x509.Certificate, []*x509.Certificate, error) {
	if len(dnsNames) == 0 {
		return nil, nil, errors.New("ca: serving certificate needs at least one DNS name")
	}
	return a.issueServing(ctx, &leafSpec{pub: pub, dnsNames: slices.Clone(dnsNames), ttl: a.cfg.clampTTL(ttl), extKeyUsage: servingExtKeyUsage()})
}

// IssueServingSVID issues an X.509-SVID for id to pub, for one of the CA's
// own endpoints that SPIFFE peers authenticate by ID (the https_spiffe
// bundle endpoint profile). It returns what IssueServing returns; id must
// be in the CA's trust domain.
func (a *Authority) IssueServingSVID(ctx context.Context, pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration) (*x509.Certificate, []*x509.Certificate, error) {
	if id.TrustDomain() != a.cfg.TrustDomain {
		return nil, nil, fmt.Errorf("%w: %s", ErrForeignTrustDomain, id)
	}
	return a.issueServing(ctx, &leafSpec{pub: pub, id: id, ttl: a.cfg.clampTTL(ttl), extKeyUsage: svidExtKeyUsage()})
}

func (a *Authority) issueServing(ctx context.Context, spec *leafSpec) (*x509.Certificate, []*x509.Certificate, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	s := a.state.Load()
	leaf, err := a.issue(s, spec)
	if err != nil {
		return nil, nil, err
	}
	if err := a.checkServingChain(s, leaf); err != nil {
		return nil, nil, err
	}
	return leaf, slices.Clone(s.above), nil
}

// checkServingChain verifies a serving certificate through the
// certificates above it to the root bundle, as a TLS client would. The
// load-time check of the material (checkLeafChain) issues a leaf with a
// SPIFFE ID only: a DNS name constraint of a CA above, which the serving
// certificate's names may break, shows only here. Issued at start and on
// renewal, not per request.
func (a *Authority) checkServingChain(s *state, leaf *x509.Certificate) error {
	if _, err := leaf.Verify(verifyOptions(s.roots, s.above, a.cfg.Clock.Now(), x509.ExtKeyUsageServerAuth)); err != nil {
		return fmt.Errorf("ca: a serving certificate for %v%v would not verify to the root bundle (a name constraint of a CA above it?): %w",
			leaf.DNSNames, leaf.URIs, err)
	}
	return nil
}
