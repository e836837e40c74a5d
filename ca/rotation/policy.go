package rotation

import (
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
)

// Defaults of Policy; see the package documentation for why.
const (
	DefaultCATTL            = 2 * 365 * 24 * time.Hour
	DefaultPrepareAt        = 1.0 / 2
	DefaultActivateAt       = 5.0 / 6
	DefaultPropagationDelay = 24 * time.Hour
	DefaultLeafMaxTTL       = ca.DefaultMaxTTL
	DefaultSkewMargin       = time.Hour
)

// Policy says when to rotate. Zero fields take the defaults above (see
// WithDefaults); use Validate before Plan.
type Policy struct {
	// CATTL is the lifetime of a generated root. The caller's Generate
	// must give roots this lifetime; Plan reads lifetimes from the
	// certificates themselves.
	CATTL time.Duration
	// PrepareAt is the fraction of the active root's lifetime at which
	// the next root is prepared (enters the bundle).
	PrepareAt float64
	// ActivateAt is the fraction of the active root's lifetime at which
	// the prepared root starts signing.
	ActivateAt float64
	// PropagationDelay is the least time a prepared root spends in the
	// bundle before it signs, for every verifier to learn it.
	PropagationDelay time.Duration
	// LeafMaxTTL is the longest lifetime of a leaf the CA issues (the
	// CA's ca.Config.MaxTTL). A root signs only while it can outlive such
	// a leaf, and stays in the bundle that long after it stops signing.
	LeafMaxTTL time.Duration
	// SkewMargin is added to LeafMaxTTL before a retiring root is
	// removed: clock skew, and replicas that switch signer late.
	SkewMargin time.Duration
	// Preview is how long a prepared root is published only to canaries
	// (ClusterTrustBundles labelled k8s.spiffe.io/canarying: preview)
	// before it goes live everywhere; PropagationDelay counts from then.
	// Zero (the default): no preview stage, a prepared root is live at
	// once. Roots only: intermediates leave the bundle as it is.
	Preview time.Duration
}

// DefaultPolicy returns the policy with every default.
func DefaultPolicy() Policy {
	p, _ := Policy{}.WithDefaults()
	return p
}

// WithDefaults returns p with zero fields defaulted, and Validate's
// verdict on the result.
func (p Policy) WithDefaults() (Policy, error) {
	if p.CATTL == 0 {
		p.CATTL = DefaultCATTL
	}
	if p.PrepareAt == 0 {
		p.PrepareAt = DefaultPrepareAt
	}
	if p.ActivateAt == 0 {
		p.ActivateAt = DefaultActivateAt
	}
	if p.PropagationDelay == 0 {
		p.PropagationDelay = DefaultPropagationDelay
	}
	if p.LeafMaxTTL == 0 {
		p.LeafMaxTTL = DefaultLeafMaxTTL
	}
	if p.SkewMargin == 0 {
		p.SkewMargin = DefaultSkewMargin
	}
	return p, p.Validate()
}

// Validate refuses a policy that cannot rotate safely: a root prepared at
// PrepareAt of its predecessor's life must be able to spend
// PropagationDelay in the bundle and then still sign a leaf of LeafMaxTTL
// before its predecessor would outlive its own leaves, that is
// CATTL × (1 − PrepareAt) ≥ LeafMaxTTL + PropagationDelay (+ Preview).
func (p Policy) Validate() error {
	switch {
	case p.CATTL <= 0 || p.LeafMaxTTL <= 0:
		return errors.New("rotation: CATTL and LeafMaxTTL must be positive")
	case p.PropagationDelay < 0 || p.SkewMargin < 0 || p.Preview < 0:
		return errors.New("rotation: PropagationDelay, SkewMargin and Preview must not be negative")
	case !(0 < p.PrepareAt && p.PrepareAt < p.ActivateAt && p.ActivateAt < 1):
		return fmt.Errorf("rotation: want 0 < PrepareAt (%g) < ActivateAt (%g) < 1", p.PrepareAt, p.ActivateAt)
	}
	room := fraction(p.CATTL, 1-p.PrepareAt)
	if need := p.LeafMaxTTL + p.untilTrusted(); room < need {
		return &TooShortError{CATTL: p.CATTL, Room: room, Need: need, PrepareAt: p.PrepareAt,
			Least: fraction(need, 1/(1-p.PrepareAt))}
	}
	return nil
}

// TooShortError is Validate's answer to a CATTL that leaves, after
// PrepareAt of its life, less than Need (LeafMaxTTL + PropagationDelay).
// Least is the shortest CATTL that would do.
type TooShortError struct {
	CATTL, Room, Need, Least time.Duration
	PrepareAt                float64
}

func (e *TooShortError) Error() string {
	return fmt.Sprintf("rotation: CATTL %v leaves %v after PrepareAt, less than LeafMaxTTL + PropagationDelay = %v",
		e.CATTL, e.Room, e.Need)
}

// ForKind returns the policy that rotates authorities of kind k: p itself
// for self-signed roots; for intermediates of a plug-in root, p without
// PropagationDelay; for upstream intermediates, p without Preview (and
// PlanUnder drops PropagationDelay while the anchor stays the same).
// Rotating an intermediate leaves the trust bundle (the external roots)
// as it is, and every chain the CA returns carries the intermediate that
// signed its leaf, so a verifier holding the roots verifies a leaf of the
// new intermediate the moment it is issued: there is nothing to
// propagate. (A verifier that pins intermediates, or a peer that sends
// its leaf without the chain, is not supported either way.)
func (p Policy) ForKind(k castate.Kind) Policy {
	switch k {
	case castate.KindIntermediates:
		p.PropagationDelay, p.Preview = 0, 0
	case castate.KindUpstream:
		p.Preview = 0 // no canary stage: the upstream, not the CA, decides its anchors
	}
	return p
}

// untilTrusted is how long after it is prepared a root may sign: its
// preview stage, then the propagation delay.
func (p Policy) untilTrusted() time.Duration {
	return p.Preview + p.PropagationDelay
}

// Previewing returns the roots of s still in their preview stage at now
// (prepared less than Preview ago) and when the first of them goes live;
// none, and a zero time, without a preview stage or for intermediates.
func Previewing(s castate.State, now time.Time, p Policy) ([]*x509.Certificate, time.Time) {
	p = p.ForKind(s.Kind)
	var out []*x509.Certificate
	var next time.Time
	for _, a := range s.Authorities {
		live := a.PreparedAt.Add(p.Preview)
		if a.Status != castate.StatusPrepared || p.Preview == 0 || !now.Before(live) {
			continue
		}
		out = append(out, a.Cert)
		if next.IsZero() || live.Before(next) {
			next = live
		}
	}
	return out, next
}

// retireAfter is how long a root stays in the bundle once it stops signing.
func (p Policy) retireAfter() time.Duration {
	return p.LeafMaxTTL + p.SkewMargin
}

// fraction returns f × d.
func fraction(d time.Duration, f float64) time.Duration {
	return time.Duration(float64(d) * f)
}
