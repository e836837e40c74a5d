package rootset

import (
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Peer is the roots held of one federated trust domain, to be published
// beside ours.
type Peer struct {
	TrustDomain spiffeid.TrustDomain
	Roots       []*x509.Certificate
}

// Reasons a peer's roots are left out, a bounded set (safe as a metric
// label).
const (
	// ReasonInvalid: a root is not a CA certificate that may sign
	// certificates.
	ReasonInvalid = "invalid"
	// ReasonOverBudget: with the peer's roots, the content would be over
	// the destination's size budget.
	ReasonOverBudget = "over_size_budget"
	// ReasonDNSUnconstrained: a root may vouch for our DNS names (see
	// KeepsOffDNS).
	ReasonDNSUnconstrained = "dns_not_constrained"
)

// LeftOut is a peer whose roots were not published, and why.
type LeftOut struct {
	TrustDomain spiffeid.TrustDomain
	// Reason is one of the Reason* values; Err says what exactly.
	Reason string
	Err    error
}

// Composition says what goes into one destination: its limit in bytes of
// PEM, and the check each peer root must pass besides being a CA
// certificate (nil: none). The check's error is reported with
// ReasonDNSUnconstrained when it wraps ErrDNSUnconstrained, otherwise
// with ReasonInvalid.
type Composition struct {
	Budget int
	Check  func(*x509.Certificate) error
}

// Compose returns the canonical PEM (as PEM returns it) of our roots and
// of every peer whose roots pass the checks and still fit the budget,
// peers taken in order, and the peers left out. Our roots always go in:
// only their own fault (none, one not a CA, over the budget alone) is an
// error. A peer is judged on its roots alone and left out whole; a peer
// holding no roots yet is neither published nor reported.
func (c Composition) Compose(own []*x509.Certificate, peers []Peer) (string, []LeftOut, error) {
	content, err := PEM(own)
	if err != nil {
		return "", nil, err
	}
	if c.Budget > 0 && len(content) > c.Budget {
		return "", nil, fmt.Errorf("%w: our roots alone are %d bytes of PEM, over the %d-byte limit", ErrInvalid, len(content), c.Budget)
	}
	set := slices.Clone(own)
	var out []LeftOut
	for _, p := range peers {
		if !slices.ContainsFunc(p.Roots, func(r *x509.Certificate) bool { return r != nil }) {
			continue
		}
		next, reason, err := c.add(set, p.Roots)
		if err != nil {
			out = append(out, LeftOut{TrustDomain: p.TrustDomain, Reason: reason, Err: err})
			continue
		}
		set, content = append(set, p.Roots...), next
	}
	return content, out, nil
}

// add returns the PEM of set and roots, or why roots may not join set.
func (c Composition) add(set, roots []*x509.Certificate) (string, string, error) {
	for _, r := range roots {
		if r == nil {
			continue
		}
		if err := CheckCA(r); err != nil {
			return "", ReasonInvalid, err
		}
		if c.Check == nil {
			continue
		}
		if err := c.Check(r); errors.Is(err, ErrDNSUnconstrained) {
			return "", ReasonDNSUnconstrained, err
		} else if err != nil {
			return "", ReasonInvalid, err
		}
	}
	// PEM is larger than DER: roots whose DER alone is over the budget
	// are refused without encoding them.
	if der := derSize(roots); c.Budget > 0 && der > c.Budget {
		return "", ReasonOverBudget, fmt.Errorf("%w: the roots alone are %d bytes of DER, over the %d-byte limit", ErrInvalid, der, c.Budget)
	}
	next, err := PEM(append(slices.Clone(set), roots...))
	if err != nil {
		return "", ReasonInvalid, err
	}
	if c.Budget > 0 && len(next) > c.Budget {
		return "", ReasonOverBudget, fmt.Errorf("%w: with these roots the content would be %d bytes of PEM, over the %d-byte limit", ErrInvalid, len(next), c.Budget)
	}
	return next, "", nil
}

// derSize is the sum of the DER sizes of certs.
func derSize(certs []*x509.Certificate) int {
	n := 0
	for _, c := range certs {
		if c != nil {
			n += len(c.Raw)
		}
	}
	return n
}
