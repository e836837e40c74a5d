package castate

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.step.sm/crypto/keyutil"

	"github.com/workload-ca/workload-ca/ca"
)

// ErrInvalidState is wrapped by every error that rejects a State: from
// Validate, Encode, Decode, Material and SecretStore.Update.
var ErrInvalidState = errors.New("invalid CA state")

// MaxAuthorities bounds the authorities of a State. A rotation needs three
// at most (retiring, active, prepared); the bound rejects runaway states.
const MaxAuthorities = 8

// Status is where an authority is in its life cycle. It only moves
// forward: prepared, active, retiring, then the authority is removed.
type Status string

// The statuses of an authority.
const (
	// StatusPrepared: in the bundle, not yet signing.
	StatusPrepared Status = "prepared"
	// StatusActive: the one authority that signs.
	StatusActive Status = "active"
	// StatusRetiring: no longer signs; stays in the bundle until the last
	// leaf it signed has expired.
	StatusRetiring Status = "retiring"
)

// Phases reported by State.Phase, a bounded set safe as a metric label.
const (
	PhaseSteady   = "steady"
	PhasePrepared = "prepared"
	PhaseRetiring = "retiring"
)

// Kind is what the authorities of a State are.
type Kind string

// The kinds of State.
const (
	// KindRoots, the zero value: self-signed roots. The trust bundle is
	// the authorities' certificates.
	KindRoots Kind = ""
	// KindIntermediates: intermediates, each issued by one of external
	// roots (a plug-in root CA) whose keys the state never holds. The
	// trust bundle is those roots, which the caller provides (see
	// ValidateUnder); the state does not store them.
	KindIntermediates Kind = "intermediates"
	// KindUpstream: intermediates issued by an upstream CA (Vault's PKI
	// engine, a cert-manager issuer) to keys the CA generated. Each
	// authority carries the chain the upstream returned with it (Chain:
	// upstream intermediates, then the trust anchor), so the state holds
	// its own bundle: the anchors of its authorities.
	KindUpstream Kind = "upstream"
)

// Authority is one CA certificate and its key: a self-signed root or an
// intermediate, as the State's Kind says.
type Authority struct {
	Cert *x509.Certificate
	// Key signs while the authority is prepared or active. A retiring
	// authority never signs again: its key is dropped when it starts
	// retiring and never written, so that the Secret holds no key that
	// could still sign certificates peers accept.
	Key    crypto.Signer
	Status Status
	// Chain, for KindUpstream only, is the upstream's chain of Cert:
	// every upstream intermediate in order (the issuer of Cert first),
	// then the trust anchor, the root the bundle holds (the last
	// certificate the upstream returned when it returned no self-signed
	// one).
	Chain []*x509.Certificate
	// PreparedAt is when the authority entered the bundle; ActivatedAt
	// when it started signing (zero if it never did); RetiringSince when
	// it stopped signing or was abandoned.
	PreparedAt, ActivatedAt, RetiringSince time.Time
}

// State is every authority of the CA, oldest first. Its values are shared,
// never mutated: functions that change a State return a new one.
type State struct {
	Kind        Kind
	Authorities []Authority
}

// Validate reports whether s can serve: a known Kind, at most
// MaxAuthorities, exactly one active, at most one prepared, every
// certificate a CA that may sign certificates (self-signed for KindRoots,
// not self-signed for KindIntermediates), every key matching its
// certificate, no certificate or key twice, and the timestamps each status
// needs. It does not look at the clock: whether the active authority is
// still valid is the signer's concern; nor at external roots: see
// ValidateUnder.
func (s State) Validate() error {
	if s.Kind != KindRoots && s.Kind != KindIntermediates && s.Kind != KindUpstream {
		return invalid("unknown kind %q", s.Kind)
	}
	if n := len(s.Authorities); n == 0 || n > MaxAuthorities {
		return invalid("%d authorities, want 1 to %d", n, MaxAuthorities)
	}
	count := map[Status]int{}
	for i, a := range s.Authorities {
		if err := a.validate(s.Kind); err != nil {
			return invalid("authority %d: %v", i, err)
		}
		if err := a.unlike(s.Authorities[:i]); err != nil {
			return invalid("authority %d: %v", i, err)
		}
		count[a.Status]++
	}
	if count[StatusActive] != 1 {
		return invalid("%d active authorities, want exactly 1", count[StatusActive])
	}
	if count[StatusPrepared] > 1 {
		return invalid("%d prepared authorities, want at most 1", count[StatusPrepared])
	}
	return nil
}

// Retired returns a copy of a without its key, as it is kept once it
// starts retiring.
func (a Authority) Retired() Authority {
	a.Key = nil
	return a
}

// ValidateUnder is Validate, and checks that s fits roots, the trust
// bundle the caller holds outside the state. Without roots, s must hold
// self-signed roots. With roots, s must hold intermediates, every one of
// them (prepared, active and retiring alike: a retiring intermediate's
// leaves are still in use, and verify only through its root) issued by
// one of roots, which must be CA certificates. A state of the other kind
// is refused, never reinterpreted.
func (s State) ValidateUnder(roots []*x509.Certificate) error {
	if err := s.Validate(); err != nil {
		return err
	}
	return s.fitsRoots(roots)
}

// fitsRoots is the part of ValidateUnder that Validate does not do, for
// callers that have validated s already.
func (s State) fitsRoots(roots []*x509.Certificate) error {
	switch {
	case s.Kind == KindUpstream && len(roots) > 0:
		return invalid("the state holds upstream intermediates, which carry their own roots, but external roots were given")
	case s.Kind == KindUpstream:
		return nil // each authority's chain was checked by Validate
	case len(roots) == 0 && s.Kind == KindIntermediates:
		return invalid("the state holds intermediates of external roots, but no roots were given")
	case len(roots) > 0 && s.Kind == KindRoots:
		return invalid("the state holds self-signed roots, but external roots were given")
	case s.Kind == KindRoots:
		return nil
	}
	for i, r := range roots {
		if r == nil || !r.BasicConstraintsValid || !r.IsCA {
			return invalid("external root %d is not a CA certificate", i)
		}
	}
	for i, a := range s.Authorities {
		if !slices.ContainsFunc(roots, func(r *x509.Certificate) bool { return IssuedBy(r, a.Cert) }) {
			return invalid("authority %d: %s is issued by none of the %d external roots", i, describe(a.Cert), len(roots))
		}
	}
	return nil
}

// IssuedBy reports whether root r issued certificate c: c names r as its
// issuer and r's key signed it.
func IssuedBy(r, c *x509.Certificate) bool {
	return bytes.Equal(c.RawIssuer, r.RawSubject) && c.CheckSignatureFrom(r) == nil
}

// Active returns the active authority, or the zero Authority if s has none.
func (s State) Active() Authority {
	for _, a := range s.Authorities {
		if a.Status == StatusActive {
			return a
		}
	}
	return Authority{}
}

// Material returns the signing material of a valid state of self-signed
// roots: the active key and certificate, and every authority's certificate
// (prepared, active and retiring) as the root bundle, oldest first.
func (s State) Material() (*ca.Material, error) {
	return s.MaterialUnder(nil)
}

// MaterialUnder returns the signing material of a state valid under roots
// (see ValidateUnder). Without roots, it is Material. With roots: the
// active intermediate's key and certificate, no further intermediates
// (roots issue the intermediates directly), and roots as the bundle.
func (s State) MaterialUnder(roots []*x509.Certificate) (*ca.Material, error) {
	if err := s.ValidateUnder(roots); err != nil {
		return nil, err
	}
	a := s.Active()
	if s.Kind == KindUpstream {
		return &ca.Material{Signer: a.Key, Cert: a.Cert, Intermediates: slices.Clone(a.Chain[:len(a.Chain)-1]),
			Roots: s.bundle()}, nil
	}
	if s.Kind == KindIntermediates {
		return &ca.Material{Signer: a.Key, Cert: a.Cert, Roots: slices.Clone(roots)}, nil
	}
	return &ca.Material{Signer: a.Key, Cert: a.Cert, Roots: s.bundle()}, nil
}

// Anchors returns the trust anchors of a state of upstream intermediates
// (KindUpstream): the last certificate of each authority's chain, without
// repeats, oldest authority first. Prepared and retiring authorities
// count, as for self-signed roots: a verifier must hold the anchor of the
// next intermediate before it signs, and that of the last one while its
// leaves are in use. Nil for the other kinds.
func (s State) Anchors() []*x509.Certificate {
	if s.Kind != KindUpstream {
		return nil
	}
	var out []*x509.Certificate
	for _, a := range s.Authorities {
		if len(a.Chain) == 0 {
			continue
		}
		anchor := a.Chain[len(a.Chain)-1]
		if !slices.ContainsFunc(out, anchor.Equal) {
			out = append(out, anchor)
		}
	}
	return out
}

// Phase names the rotation phase for metrics: PhasePrepared while a next
// authority waits to sign, else PhaseRetiring while an old one stays in the
// bundle, else PhaseSteady.
func (s State) Phase() string {
	phase := PhaseSteady
	for _, a := range s.Authorities {
		switch a.Status {
		case StatusPrepared:
			return PhasePrepared
		case StatusRetiring:
			phase = PhaseRetiring
		}
	}
	return phase
}

// validate checks one authority of a state of kind k on its own.
func (a Authority) validate(k Kind) error {
	if a.Cert == nil || (a.Key == nil && a.Status != StatusRetiring) {
		return errors.New("missing certificate or key")
	}
	c := a.Cert
	switch selfSigned := IssuedBy(c, c); {
	case !c.BasicConstraintsValid || !c.IsCA:
		return fmt.Errorf("%s is not a CA certificate", describe(c))
	case c.KeyUsage&x509.KeyUsageCertSign == 0:
		return fmt.Errorf("%s: key usage lacks certSign", describe(c))
	case k == KindRoots && !selfSigned:
		return fmt.Errorf("%s is not self-signed", describe(c))
	case k != KindRoots && selfSigned:
		return fmt.Errorf("%s is self-signed, want an intermediate", describe(c))
	case a.Key != nil && !keyutil.Equal(c.PublicKey, a.Key.Public()):
		return fmt.Errorf("key does not match certificate %s", describe(c))
	case k != KindUpstream && len(a.Chain) > 0:
		return fmt.Errorf("%s: only upstream intermediates carry a chain", describe(c))
	case k == KindUpstream:
		if err := checkChain(c, a.Chain); err != nil {
			return fmt.Errorf("%s: %w", describe(c), err)
		}
	}
	return a.validateTimes()
}

// checkChain requires an upstream chain for c: at least the anchor, each
// certificate a CA that issued the one before it (name and signature).
func checkChain(c *x509.Certificate, chain []*x509.Certificate) error {
	if len(chain) == 0 {
		return errors.New("no upstream chain (want at least its trust anchor)")
	}
	prev := c
	for i, x := range chain {
		switch {
		case x == nil || !x.BasicConstraintsValid || !x.IsCA:
			return fmt.Errorf("upstream chain certificate %d is not a CA certificate", i)
		case !IssuedBy(x, prev):
			return fmt.Errorf("upstream chain certificate %d %s did not issue %s", i, describe(x), describe(prev))
		}
		prev = x
	}
	return nil
}

// validateTimes requires the timestamp of the current status and none of
// the later ones. A retiring authority may lack ActivatedAt: it was
// abandoned while prepared.
func (a Authority) validateTimes() error {
	switch a.Status {
	case StatusPrepared:
		if a.PreparedAt.IsZero() || !a.ActivatedAt.IsZero() || !a.RetiringSince.IsZero() {
			return errors.New("prepared: want preparedAt only")
		}
	case StatusActive:
		if a.ActivatedAt.IsZero() || !a.RetiringSince.IsZero() {
			return errors.New("active: want activatedAt and no retiringSince")
		}
	case StatusRetiring:
		if a.RetiringSince.IsZero() {
			return errors.New("retiring: want retiringSince")
		}
	default:
		return fmt.Errorf("unknown status %q", a.Status)
	}
	return nil
}

// unlike refuses a certificate or key that one of others already has: a
// new authority always has a new key.
func (a Authority) unlike(others []Authority) error {
	for _, o := range others {
		switch {
		case bytes.Equal(a.Cert.Raw, o.Cert.Raw):
			return fmt.Errorf("duplicate certificate %s", describe(a.Cert))
		case keyutil.Equal(a.Cert.PublicKey, o.Cert.PublicKey):
			return fmt.Errorf("certificate %s reuses the key of %s", describe(a.Cert), describe(o.Cert))
		}
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidState, fmt.Sprintf(format, args...))
}

// describe names a certificate in error messages.
func describe(c *x509.Certificate) string {
	return fmt.Sprintf("(subject %q, serial %x)", c.Subject.String(), c.SerialNumber)
}
