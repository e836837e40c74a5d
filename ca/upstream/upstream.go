// Package upstream gets the CA's intermediates from a CA that a company
// already runs (Vault's PKI secrets engine, a cert-manager issuer): what
// SPIRE calls an upstream authority. The CA generates each intermediate's
// key itself, asks the upstream to sign a CSR for it, checks the answer,
// and keeps the result in its Secret (castate.KindUpstream), rotated by
// the usual plan (ca/rotation). Every leaf is still signed locally, so the
// upstream is asked once per rotation, never per workload, and an
// upstream that is down only delays the next rotation.
//
// The trust anchor the CA publishes comes from the answer only when no
// anchor is pinned (Config.TrustAnchors), and then only the first time:
// a later answer under another anchor is refused unless a change is
// allowed (Config.Current, Config.AllowAnchorChange).
package upstream

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.step.sm/crypto/keyutil"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/ca/keystore"
)

// ErrUpstream is wrapped by every error of an upstream's answer that the
// CA refuses: not a CA, another key, a chain that does not verify, too
// short a lifetime, constraints that forbid the CA's leaves.
var ErrUpstream = errors.New("upstream CA answer refused")

// ErrAnchorChange is wrapped (with ErrUpstream) when an answer chains to a
// trust anchor the CA does not trust yet, and the configuration neither
// pins that anchor nor allows a change: the current authority stays.
var ErrAnchorChange = errors.New("the upstream moved to a trust anchor that is neither pinned nor allowed")

// Authority is an upstream CA: it issues an intermediate CA certificate
// for a CSR. Implementations talk to one kind of upstream; the Minter
// checks what they return.
type Authority interface {
	// SignIntermediate asks the upstream for a CA certificate for req.CSR.
	SignIntermediate(ctx context.Context, req Request) (Issued, error)
}

// Request is what the CA asks of the upstream.
type Request struct {
	// CSR is signed by the new intermediate's key: subject O=<trust
	// domain>, CN=keystore.IntermediateCommonName, the trust domain's
	// SPIFFE ID as URI SAN.
	CSR *x509.CertificateRequest
	// TrustDomain is the CA's.
	TrustDomain spiffeid.TrustDomain
	// TTL is the lifetime to ask for (the upstream may cut it).
	TTL time.Duration
	// NameConstraints asks the upstream to constrain the intermediate to
	// the trust domain's URIs (a URI name constraint on its host), where
	// the upstream supports it.
	NameConstraints bool
}

// Issued is the upstream's answer.
type Issued struct {
	// Cert is the intermediate issued for the CSR.
	Cert *x509.Certificate
	// Chain is every certificate above Cert the upstream returned, its
	// issuer first, ending at the root; without pinned anchors, Minter
	// takes the last as the trust anchor.
	Chain []*x509.Certificate
}

// Config configures a Minter. Authority and TrustDomain are required.
type Config struct {
	Authority   Authority
	TrustDomain spiffeid.TrustDomain
	// KeyType is the key type of each intermediate (keystore.Key*).
	KeyType string
	// Lifetime is the intermediate lifetime to ask for; default
	// keystore.DefaultRootLifetime, which upstreams cut to their maximum.
	Lifetime time.Duration
	// NameConstraints: see Request.NameConstraints.
	NameConstraints bool
	// AnyPathLength accepts an intermediate that may issue CA certificates
	// (Check wants path length 0), for upstreams that cannot express it:
	// cert-manager's CertificateRequest has no field for it, and its
	// issuers override the CSR's. Generate then logs a warning.
	AnyPathLength bool
	// Timeout bounds each request to the upstream (default one minute).
	Timeout time.Duration
	// TrustAnchors, if any, are pinned: an answer must chain to one of
	// them, and the anchor the CA publishes is the pinned certificate, not
	// the last one of the answer (cert-manager's status.ca is best effort;
	// whoever edits an issuer or a request's status could name another).
	// A move of the upstream to another pinned anchor is adopted.
	TrustAnchors []*x509.Certificate
	// Current returns the anchors the CA trusts now (those of the CA
	// Secret's state, source.Source.Anchors). Without TrustAnchors, an
	// answer under another anchor is refused (ErrAnchorChange) unless
	// AllowAnchorChange: the first anchor the CA adopted stays pinned by
	// its state. Nil, or nothing current (the Secret's first intermediate):
	// the answer's anchor is adopted.
	Current func() []*x509.Certificate
	// AllowAnchorChange adopts an unpinned anchor the CA does not trust
	// yet (logged as a warning), as the CA did before anchors were pinned.
	AllowAnchorChange bool
	// Now is the clock the answer is checked with when it arrives
	// (default time.Now): an upstream that does not backdate (cert-manager)
	// issues certificates valid from the moment it signs.
	Now    func() time.Time
	Logger *slog.Logger
	// Observer is told each attempt's outcome.
	Observer Observer
}

// Observer receives the outcome of each request to the upstream, for
// metrics. It must be safe for concurrent use and fast.
type Observer interface {
	// UpstreamRequest is called after each request, with its error.
	UpstreamRequest(err error, took time.Duration)
}

// Minter mints intermediates through an upstream: its Generate is the
// rotation's Generate (castate.SecretConfig, rotation.Config).
type Minter struct {
	cfg Config
}

// New checks cfg and returns a Minter.
func New(cfg Config) (*Minter, error) {
	switch {
	case cfg.Authority == nil:
		return nil, errors.New("upstream: missing Authority")
	case cfg.TrustDomain.IsZero():
		return nil, errors.New("upstream: missing TrustDomain")
	}
	if err := keystore.CheckKeyType(cfg.KeyType); err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	if cfg.Lifetime <= 0 {
		cfg.Lifetime = keystore.DefaultRootLifetime
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Minter{cfg: cfg}, nil
}

// Generate makes a new intermediate key, has the upstream issue its
// certificate, and returns the checked material: the intermediate and its
// key, the upstream's intermediates, and its trust anchor as the only root.
// The answer is checked when it arrives (Config.Now), not at now.
func (m *Minter) Generate(ctx context.Context, now time.Time) (*ca.Material, error) {
	key, err := keystore.NewKey(m.cfg.KeyType)
	if err != nil {
		return nil, err
	}
	exts, err := caExtensions()
	if err != nil {
		return nil, fmt.Errorf("upstream: CSR: %w", err)
	}
	tmpl := &x509.CertificateRequest{
		Subject: pkix.Name{Organization: []string{m.cfg.TrustDomain.Name()}, CommonName: keystore.IntermediateCommonName},
		URIs:    []*url.URL{m.cfg.TrustDomain.ID().URL()}, ExtraExtensions: exts,
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, fmt.Errorf("upstream: CSR: %w", err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("upstream: CSR: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	start := time.Now()
	issued, err := m.cfg.Authority.SignIntermediate(ctx, Request{CSR: csr, TrustDomain: m.cfg.TrustDomain,
		TTL: m.cfg.Lifetime, NameConstraints: m.cfg.NameConstraints})
	var mat *ca.Material
	if err == nil {
		mat, err = m.check(issued, key, later(now, m.cfg.Now()))
	}
	if err == nil {
		err = m.checkAnchor(ctx, mat.Roots[0])
	}
	m.cfg.Observer.UpstreamRequest(err, time.Since(start))
	if err != nil {
		return nil, err
	}
	m.cfg.Logger.InfoContext(ctx, "upstream issued an intermediate", "serial", fmt.Sprintf("%x", mat.Cert.SerialNumber),
		"issuer", mat.Cert.Issuer.String(), "not_after", mat.Cert.NotAfter, "anchor", mat.Roots[0].Subject.String(),
		"chain", len(mat.Intermediates))
	return mat, nil
}

// checkAnchor refuses a new anchor that is neither pinned nor allowed:
// see Config.Current.
func (m *Minter) checkAnchor(ctx context.Context, anchor *x509.Certificate) error {
	if len(m.cfg.TrustAnchors) > 0 || m.cfg.Current == nil {
		return nil // Check verified the answer to a pinned anchor
	}
	current := m.cfg.Current()
	if len(current) == 0 || slices.ContainsFunc(current, anchor.Equal) {
		return nil
	}
	if m.cfg.AllowAnchorChange {
		m.cfg.Logger.WarnContext(ctx, "the upstream moved to a new trust anchor; adopting it (allowAnchorChange)",
			"anchor", describe(anchor), "sha256", fingerprint(anchor), "current", len(current))
		return nil
	}
	return fmt.Errorf("%w: %w: the answer chains to %s (sha256 %s), not to the %d anchor(s) the CA trusts (first %s); "+
		"the current intermediate keeps signing; pin the new anchor (trustAnchorFile) or set allowAnchorChange to adopt it",
		ErrUpstream, ErrAnchorChange, describe(anchor), fingerprint(anchor), len(current), describe(current[0]))
}

// check is Check with the Minter's trust domain and options.
func (m *Minter) check(issued Issued, key crypto.Signer, now time.Time) (*ca.Material, error) {
	mat, err := Check(issued, key, CheckOptions{TrustDomain: m.cfg.TrustDomain, Now: now, AnyPathLength: m.cfg.AnyPathLength,
		TrustAnchors: m.cfg.TrustAnchors})
	if err == nil && !pathLenZero(mat.Cert) {
		m.cfg.Logger.Warn("the upstream issued an intermediate that may issue CA certificates (it cannot be asked for path length 0); "+
			"the CA never does, but a stolen intermediate key could", "serial", fmt.Sprintf("%x", mat.Cert.SerialNumber), "path_length", pathLen(mat.Cert))
	}
	return mat, err
}

// CheckOptions are what Check checks an answer against.
type CheckOptions struct {
	TrustDomain spiffeid.TrustDomain
	Now         time.Time
	// AnyPathLength: see Config.AnyPathLength.
	AnyPathLength bool
	// TrustAnchors: see Config.TrustAnchors.
	TrustAnchors []*x509.Certificate
}

// Check returns the signing material of an upstream's answer for key, or
// why the CA refuses it (wrapping ErrUpstream): Cert must be a CA allowed
// to sign certificates, of path length 0 (it issues leaves only; unless
// opts.AnyPathLength), for key, valid at opts.Now, and chain through Chain, in order, to its last
// certificate (the trust anchor); a leaf it signs must verify to that
// anchor for client and server authentication (the constraints of the
// upstream's CAs, a name constraint among them, must allow the trust
// domain's SPIFFE IDs). With opts.TrustAnchors, the anchor is the pinned
// one the chain leads to instead: the chain is cut at the first pinned
// certificate in it, or else its last certificate (Cert, if Chain is
// empty) must be issued by a pinned anchor; an answer that leads to no
// pinned anchor is refused.
func Check(issued Issued, key crypto.Signer, opts CheckOptions) (*ca.Material, error) {
	c := issued.Cert
	switch {
	case c == nil:
		return nil, refused("no certificate")
	case !c.BasicConstraintsValid || !c.IsCA:
		return nil, refused("%s is not a CA certificate", describe(c))
	case !opts.AnyPathLength && !pathLenZero(c):
		return nil, refused("%s may issue CA certificates (path length %s), want path length 0", describe(c), pathLen(c))
	case !keyutil.Equal(c.PublicKey, key.Public()):
		return nil, refused("%s is not for the key the CA asked for", describe(c))
	case len(issued.Chain) == 0 && len(opts.TrustAnchors) == 0:
		return nil, refused("no chain above %s: the CA needs the upstream's root for its trust bundle", describe(c))
	case slices.Contains(issued.Chain, nil) || slices.Contains(opts.TrustAnchors, nil):
		return nil, refused("nil certificate in the chain")
	}
	prev := c
	for i, x := range issued.Chain {
		if !castate.IssuedBy(x, prev) {
			return nil, refused("chain certificate %d %s did not issue %s: want the chain in order, issuer first", i, describe(x), describe(prev))
		}
		prev = x
	}
	chain, err := toAnchor(c, issued.Chain, opts.TrustAnchors)
	if err != nil {
		return nil, err
	}
	n := len(chain)
	m := &ca.Material{Signer: key, Cert: c, Intermediates: slices.Clone(chain[:n-1]), Roots: slices.Clone(chain[n-1:])}
	// ca.New checks the rest as it will when the material signs: validity,
	// key usage, the chain, the trust domain, and a leaf's verification.
	if _, err := ca.New(ca.Config{TrustDomain: opts.TrustDomain, Clock: fixedClock(opts.Now)}, m); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUpstream, err)
	}
	return m, nil
}

// toAnchor returns chain (in order above c) ending at its trust anchor:
// without pins, chain itself (its last certificate is the anchor); with
// pins, chain cut at its first pinned certificate, or chain and the pinned
// anchor that issued its last certificate.
func toAnchor(c *x509.Certificate, chain, pins []*x509.Certificate) ([]*x509.Certificate, error) {
	if len(pins) == 0 {
		return chain, nil
	}
	for i, x := range chain {
		if slices.ContainsFunc(pins, x.Equal) {
			return chain[:i+1], nil
		}
	}
	top := c
	if len(chain) > 0 {
		top = chain[len(chain)-1]
	}
	for _, p := range pins {
		if castate.IssuedBy(p, top) {
			return append(slices.Clone(chain), p), nil
		}
	}
	return nil, refused("the chain above %s ends at %s, which none of the %d pinned trust anchors issued (trustAnchorFile)",
		describe(c), describe(top), len(pins))
}

// fingerprint is the SHA-256 of c's DER, in hex, as logs name anchors.
func fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUpstream, fmt.Sprintf(format, args...))
}

func describe(c *x509.Certificate) string {
	return fmt.Sprintf("(subject %q, serial %x)", c.Subject.String(), c.SerialNumber)
}

// pathLenZero reports an explicit path length of 0: crypto/x509 reads an
// absent one as -1 (or 0 without MaxPathLenZero).
func pathLenZero(c *x509.Certificate) bool {
	return c.MaxPathLen == 0 && c.MaxPathLenZero
}

func pathLen(c *x509.Certificate) string {
	if c.MaxPathLen < 0 || (c.MaxPathLen == 0 && !c.MaxPathLenZero) {
		return "unlimited"
	}
	return fmt.Sprint(c.MaxPathLen)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// fixedClock is a clock.PassiveClock stopped at a moment.
type fixedClock time.Time

func (c fixedClock) Now() time.Time                  { return time.Time(c) }
func (c fixedClock) Since(t time.Time) time.Duration { return time.Time(c).Sub(t) }

// caExtensions are the extensions the CSR requests: basic constraints
// CA:TRUE with path length 0, and key usage certSign and cRLSign. An
// upstream that takes the CSR's values (Vault's use_csr_values, a
// cert-manager issuer) then issues exactly the CA the CA checks for.
func caExtensions() ([]pkix.Extension, error) {
	bc, err := asn1.Marshal(struct {
		IsCA       bool
		MaxPathLen int
	}{true, 0})
	if err != nil {
		return nil, err
	}
	// keyCertSign is bit 5 and cRLSign bit 6 of the KeyUsage BIT STRING.
	ku, err := asn1.Marshal(asn1.BitString{Bytes: []byte{0x06}, BitLength: 7})
	if err != nil {
		return nil, err
	}
	return []pkix.Extension{
		{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: bc},
		{Id: asn1.ObjectIdentifier{2, 5, 29, 15}, Critical: true, Value: ku},
	}, nil
}

type nopObserver struct{}

func (nopObserver) UpstreamRequest(error, time.Duration) {}
