package rotation

import (
	"crypto/x509"
	"slices"
	"time"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
)

// Step is one change to the CA state.
type Step string

// The steps Plan returns; their values are safe as metric labels.
const (
	// StepNone: nothing can ever be done (the state has no active root).
	StepNone Step = "none"
	// StepPrepare adds a new root, prepared: in the bundle, not signing.
	StepPrepare Step = "prepare"
	// StepActivate makes the prepared root sign; in the same write the
	// active root starts retiring, so exactly one root always signs.
	StepActivate Step = "activate"
	// StepRetireStart abandons a prepared root that can no longer sign a
	// full-length leaf (a leader was down through its window, or its
	// certificate is too short-lived). It retires like a root that has
	// signed: conservative, since only the Secret says it has not.
	StepRetireStart Step = "retire-start"
	// StepRemove drops the root that has been retiring longest from the
	// bundle.
	StepRemove Step = "remove"
)

// Issuer is the root that issues a state's next intermediate
// (castate.KindIntermediates): the plug-in root, which its operator may
// replace.
type Issuer struct {
	// Cert is the root that issues the next intermediate.
	Cert *x509.Certificate
	// TrustedFrom is when every verifier can be taken to hold Cert: when
	// the CA first saw it in the trust bundle, plus the propagation delay
	// of roots.
	TrustedFrom time.Time
}

// Plan returns the next step for state s and when it is due; a step whose
// time is not after now is due now. It is a pure function of its
// arguments; p must be valid (see Policy.Validate). With the active root
// A, of lifetime L = A.NotAfter − A.NotBefore (for upstream intermediates,
// A.NotAfter is the first expiry of A and its upstream chain, and so for
// P below):
//
//   - A stops being due to sign at activate = min(A.NotBefore + ActivateAt·L,
//     A.NotAfter − LeafMaxTTL): it never signs when it could not outlive a
//     leaf of LeafMaxTTL.
//   - Without a prepared root, prepare at min(A.NotBefore + PrepareAt·L,
//     activate − Preview − PropagationDelay), but not before activate + LeafMaxTTL −
//     CATTL, so that the new root outlives its own leaves from activate on.
//   - A prepared root P activates at max(P.PreparedAt + Preview + PropagationDelay,
//     P.NotBefore, min(activate, P.NotAfter − LeafMaxTTL)), or as soon as
//     P is valid if A has expired (an expired root cannot sign at all, so
//     waiting for propagation would only prolong the outage). If P can no
//     longer sign a full-length leaf, it is retired (StepRetireStart) and
//     a fresh root is prepared.
//   - A retiring root is removed at RetiringSince + LeafMaxTTL +
//     SkewMargin, never before.
//
// When several steps are due, the one due first comes first; on a tie,
// removal.
//
// For a state of intermediates (castate.KindIntermediates) PropagationDelay
// is zero: see Policy.ForKind. For upstream intermediates
// (castate.KindUpstream) it is zero when the prepared one chains to the
// anchor of the active one (the bundle is unchanged), and applies when the
// upstream moved to a new anchor, which must reach every verifier first. PlanUnder also follows a change of the root
// that issues them.
func Plan(s castate.State, now time.Time, p Policy) (Step, time.Time) {
	return PlanUnder(s, now, p, Issuer{})
}

// PlanUnder is Plan for a state of intermediates whose next ones iss
// issues (a zero iss, or a state of roots, is Plan). When the operator
// replaces the plug-in root, the CA moves to it without waiting for the
// scheduled rotation, and no sooner than every verifier trusts it:
//
//   - a prepared intermediate that iss did not issue is retired at once
//     (StepRetireStart): it would activate under the old root;
//   - if iss did not issue the active intermediate either, the next one
//     is prepared at once, and activates at max(iss.TrustedFrom, its
//     PreparedAt and NotBefore) instead of at the active one's scheduled
//     hand-over (but as soon as it is valid if the active one has
//     expired).
func PlanUnder(s castate.State, now time.Time, p Policy, iss Issuer) (Step, time.Time) {
	p = p.ForKind(s.Kind)
	active, ok := find(s, castate.StatusActive)
	if !ok {
		return StepNone, time.Time{}
	}
	next := due{step: StepNone}
	for _, a := range s.Authorities {
		if a.Status == castate.StatusRetiring {
			next = next.sooner(StepRemove, a.RetiringSince.Add(p.retireAfter()))
		}
	}
	follow := iss.Cert != nil && s.Kind == castate.KindIntermediates
	switching := follow && !castate.IssuedBy(iss.Cert, active.Cert)
	prep, prepared := find(s, castate.StatusPrepared)
	if prepared && s.Kind == castate.KindUpstream && sameAnchor(prep, active) {
		p.PropagationDelay = 0 // the bundle holds its anchor already
	}
	switch {
	case prepared && follow && !castate.IssuedBy(iss.Cert, prep.Cert):
		next = next.sooner(StepRetireStart, now)
	case prepared && switching && now.Before(spanOf(active).notAfter):
		step, at := planPrepared(spanOf(active), prep, now, p)
		if step == StepActivate {
			at = later(later(prep.PreparedAt, prep.Cert.NotBefore), iss.TrustedFrom)
		}
		next = next.sooner(step, at)
	case prepared:
		next = next.sooner(planPrepared(spanOf(active), prep, now, p))
	case switching:
		next = next.sooner(StepPrepare, now)
	default:
		next = next.sooner(StepPrepare, prepareTime(spanOf(active), p))
	}
	return next.step, next.at
}

// sameAnchor reports whether upstream intermediates a and b chain to the
// same trust anchor.
func sameAnchor(a, b castate.Authority) bool {
	return len(a.Chain) > 0 && len(b.Chain) > 0 && a.Chain[len(a.Chain)-1].Equal(b.Chain[len(b.Chain)-1])
}

// span is when an authority's leaves verify: from its certificate's
// NotBefore to the first expiry of its certificate and, for upstream
// intermediates, of the upstream chain above it (an upstream root that
// expires before the intermediate ends its use). The plan's NotBefore,
// NotAfter and lifetime are a span's.
type span struct{ notBefore, notAfter time.Time }

// spanOf is the span of authority a.
func spanOf(a castate.Authority) span {
	return span{notBefore: a.Cert.NotBefore, notAfter: ChainNotAfter(a.Cert, a.Chain)}
}

// ChainNotAfter is the first NotAfter of c and the chain above it.
func ChainNotAfter(c *x509.Certificate, chain []*x509.Certificate) time.Time {
	end := c.NotAfter
	for _, x := range chain {
		end = earlier(end, x.NotAfter)
	}
	return end
}

// planPrepared decides between activating and abandoning prep.
func planPrepared(active span, prep castate.Authority, now time.Time, p Policy) (Step, time.Time) {
	earliest := later(prep.PreparedAt.Add(p.untilTrusted()), prep.Cert.NotBefore)
	deadline := signDeadline(spanOf(prep), p)
	switch {
	case deadline.Before(earliest) || now.After(deadline):
		return StepRetireStart, now
	case !now.Before(active.notAfter):
		return StepActivate, later(now, prep.Cert.NotBefore)
	}
	return StepActivate, later(earliest, earlier(activateTime(active, p), deadline))
}

// activateTime is when the active authority of span c should hand over.
func activateTime(c span, p Policy) time.Time {
	return earlier(c.notBefore.Add(fraction(c.lifetime(), p.ActivateAt)), signDeadline(c, p))
}

// prepareTime is when the successor of the active authority of span c is
// prepared.
func prepareTime(c span, p Policy) time.Time {
	act := activateTime(c, p)
	at := earlier(c.notBefore.Add(fraction(c.lifetime(), p.PrepareAt)), act.Add(-p.untilTrusted()))
	return later(at, act.Add(p.LeafMaxTTL-p.CATTL))
}

// signDeadline is the last moment an authority of span c can sign a leaf
// of LeafMaxTTL without the leaf outliving it.
func signDeadline(c span, p Policy) time.Time {
	return c.notAfter.Add(-p.LeafMaxTTL)
}

func (c span) lifetime() time.Duration {
	return c.notAfter.Sub(c.notBefore)
}

// Apply returns s after step, taken at now; s itself is not changed, and
// the result is of the same kind. StepPrepare adds m (required) as the
// prepared root or intermediate. A step that does
// not apply to s (activating without a prepared root, say) returns s
// unchanged. Apply does not check that the step is due: Plan does.
func Apply(s castate.State, step Step, now time.Time, m *ca.Material) castate.State {
	out, _ := apply(s, step, now, m)
	return out
}

// apply is Apply, also reporting whether the step applied.
func apply(s castate.State, step Step, now time.Time, m *ca.Material) (castate.State, bool) {
	out := castate.State{Kind: s.Kind, Authorities: slices.Clone(s.Authorities)}
	auths := out.Authorities
	prep := slices.IndexFunc(auths, hasStatus(castate.StatusPrepared))
	old := longestRetiring(auths)
	switch {
	case step == StepPrepare && m != nil && prep < 0:
		out.Authorities = append(out.Authorities, castate.Authority{
			Cert: m.Cert, Key: m.Signer, Status: castate.StatusPrepared, PreparedAt: now,
			Chain: castate.UpstreamChain(s.Kind, m),
		})
	case step == StepActivate && prep >= 0:
		if cur := slices.IndexFunc(auths, hasStatus(castate.StatusActive)); cur >= 0 {
			auths[cur] = auths[cur].Retired()
			auths[cur].Status, auths[cur].RetiringSince = castate.StatusRetiring, now
		}
		auths[prep].Status, auths[prep].ActivatedAt = castate.StatusActive, now
	case step == StepRetireStart && prep >= 0:
		auths[prep] = auths[prep].Retired()
		auths[prep].Status, auths[prep].RetiringSince = castate.StatusRetiring, now
	case step == StepRemove && old >= 0:
		out.Authorities = slices.Delete(auths, old, old+1)
	default:
		return s, false
	}
	return out, true
}

// longestRetiring is the index of the retiring authority with the earliest
// RetiringSince (the first of equals), or -1.
func longestRetiring(auths []castate.Authority) int {
	best := -1
	for i, a := range auths {
		if a.Status == castate.StatusRetiring && (best < 0 || a.RetiringSince.Before(auths[best].RetiringSince)) {
			best = i
		}
	}
	return best
}

func find(s castate.State, st castate.Status) (castate.Authority, bool) {
	i := slices.IndexFunc(s.Authorities, hasStatus(st))
	if i < 0 {
		return castate.Authority{}, false
	}
	return s.Authorities[i], true
}

func hasStatus(st castate.Status) func(castate.Authority) bool {
	return func(a castate.Authority) bool { return a.Status == st }
}

// due is a step and its time; sooner keeps the earlier of two.
type due struct {
	step Step
	at   time.Time
}

func (d due) sooner(step Step, at time.Time) due {
	if d.step == StepNone || at.Before(d.at) {
		return due{step: step, at: at}
	}
	return d
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
