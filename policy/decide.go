package policy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/interpreter"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/issuance"
)

// Labels looks up the labels of a cluster's namespaces and nodes. An
// object that does not exist has none; an error (wrapping
// issuance.ErrPolicyUnavailable or not) means they are not known now.
type Labels interface {
	NamespaceLabels(cluster, name string) (map[string]string, error)
	NodeLabels(cluster, name string) (map[string]string, error)
}

// Observer is told of every decision of a policy, for metrics.
type Observer interface {
	PolicyDecided(policy, decision string)
}

// The decisions, as Observer hears them.
const (
	DecisionDenied      = "denied"
	DecisionWouldDeny   = "would-deny"
	DecisionUnavailable = "unavailable"
	DecisionTTLCapped   = "ttl-capped"
)

// AllDecisions lists every decision an Observer may hear.
func AllDecisions() []string {
	return []string{DecisionDenied, DecisionWouldDeny, DecisionUnavailable, DecisionTTLCapped}
}

// Tally counts each policy's decisions, by its Key (a policy deleted and
// created again under its name is another policy), until they are taken
// (to be added to its status); it outlives the Sets built with it.
type Tally struct {
	mu     sync.Mutex
	counts map[string]*counts
}

type counts struct {
	selected, denied, wouldDeny, unavailable, ttlCapped atomic.Int64
}

func (t *Tally) of(key string) *counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.counts == nil {
		t.counts = map[string]*counts{}
	}
	c, ok := t.counts[key]
	if !ok {
		c = &counts{}
		t.counts[key] = c
	}
	return c
}

// Take returns the counts since the last Take, by policy Key, and starts
// again from zero; a policy that decided nothing is left out.
func (t *Tally) Take() map[string]Decisions {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]Decisions{}
	for name, c := range t.counts {
		d := Decisions{Selected: c.selected.Swap(0), Denied: c.denied.Swap(0), WouldDeny: c.wouldDeny.Swap(0),
			Unavailable: c.unavailable.Swap(0), TTLCapped: c.ttlCapped.Swap(0)}
		if d != (Decisions{}) {
			out[name] = d
		}
	}
	return out
}

// Return adds back counts taken that could not be written.
func (t *Tally) Return(key string, d Decisions) {
	c := t.of(key)
	c.selected.Add(d.Selected)
	c.denied.Add(d.Denied)
	c.wouldDeny.Add(d.WouldDeny)
	c.unavailable.Add(d.Unavailable)
	c.ttlCapped.Add(d.TTLCapped)
}

// Forget drops the counts of a policy that is gone.
func (t *Tally) Forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.counts, key)
}

// Key names a policy in a Tally: its uid, or its name when it has none.
func (c *Compiled) Key() string {
	if c.UID != "" {
		return c.UID
	}
	return c.Name
}

// Set is every policy installed, in name order: an issuance.Policy.
type Set struct {
	policies []entry
	labels   Labels
	obs      Observer
	ttl      func(time.Duration) time.Duration
}

type entry struct {
	*Compiled
	counts *counts
}

// SetConfig is what a Set needs besides its policies. Tally is required.
type SetConfig struct {
	Labels   Labels
	Tally    *Tally
	Observer Observer
	// TTL is the lifetime the CA gives a request asking for a TTL (its
	// default and maximum applied; ca.Authority.TTL): the ttl variable,
	// and what a cap must be under to lower anything. Nil: as asked.
	TTL func(requested time.Duration) time.Duration
}

// NewSet returns the set of policies, which must be in name order.
func NewSet(policies []*Compiled, cfg SetConfig) *Set {
	s := &Set{labels: cfg.Labels, obs: cfg.Observer, ttl: cfg.TTL}
	if s.ttl == nil {
		s.ttl = func(d time.Duration) time.Duration { return d }
	}
	if s.obs == nil {
		s.obs = nopObserver{}
	}
	if s.labels == nil {
		s.labels = noLabels{}
	}
	for _, p := range policies {
		s.policies = append(s.policies, entry{Compiled: p, counts: cfg.Tally.of(p.Key())})
	}
	return s
}

type nopObserver struct{}

func (nopObserver) PolicyDecided(string, string) {}

type noLabels struct{}

var errNoLabels = fmt.Errorf("%w: labels are not watched", issuance.ErrPolicyUnavailable)

func (noLabels) NamespaceLabels(string, string) (map[string]string, error) { return nil, errNoLabels }
func (noLabels) NodeLabels(string, string) (map[string]string, error)      { return nil, errNoLabels }

// Decide decides r, granted identity granted, at door: every policy that
// selects it, in name order, until one refuses it.
func (s *Set) Decide(ctx context.Context, door string, r *issuance.Request, granted spiffeid.ID) (issuance.Verdict, error) {
	var v issuance.Verdict
	if len(s.policies) == 0 {
		return v, nil
	}
	in := newInput(door, r, granted, s.labels, s.ttl(r.TTL))
	for i := range s.policies {
		e := &s.policies[i]
		capped, refusal := e.decide(ctx, in, &v)
		if capped {
			s.obs.PolicyDecided(e.Name, DecisionTTLCapped)
		}
		if refusal == nil {
			continue
		}
		switch {
		case e.DryRun:
			e.counts.wouldDeny.Add(1)
			v.WouldDeny = append(v.WouldDeny, e.Name)
			s.obs.PolicyDecided(e.Name, DecisionWouldDeny)
			continue
		case errors.Is(refusal, issuance.ErrPolicyUnavailable):
			e.counts.unavailable.Add(1)
			s.obs.PolicyDecided(e.Name, DecisionUnavailable)
		default:
			e.counts.denied.Add(1)
			s.obs.PolicyDecided(e.Name, DecisionDenied)
		}
		return v, refusal
	}
	return v, nil
}

// decide applies one policy to in: nil if it does not select the request
// or lets it through (capped: it lowered the lifetime, into v), or its
// refusal (a *issuance.PolicyError).
func (e *entry) decide(ctx context.Context, in *input, v *issuance.Verdict) (capped bool, _ error) {
	ok, err := e.selects(in.door, in.r.Cluster, in.identity, in.namespaceLabels)
	if err != nil {
		e.counts.selected.Add(1)
		return false, unavailable(e.Name, fmt.Errorf("match.namespaceSelector: %w", err))
	}
	if !ok {
		return false, nil
	}
	if e.Err != nil {
		e.counts.selected.Add(1)
		// The compiler's message is in the policy's status and the
		// CA's log; the caller learns no more of the policy's source.
		return false, &issuance.PolicyError{Policy: e.Name, Message: "it does not compile (its Compiled condition says why)", Err: issuance.ErrPolicyUnavailable}
	}
	for _, c := range e.conditions {
		matched, err := in.eval(ctx, c)
		if err != nil {
			e.counts.selected.Add(1)
			return false, in.refusal(e.Name, c, err)
		}
		if !matched.(bool) {
			return false, nil
		}
	}
	e.counts.selected.Add(1)
	for _, c := range e.validations {
		valid, err := in.eval(ctx, c)
		if err != nil {
			return false, in.refusal(e.Name, c, err)
		}
		if !valid.(bool) {
			return false, &issuance.PolicyError{Policy: e.Name, Message: c.message}
		}
	}
	if e.maxTTL == nil || e.DryRun {
		return false, nil
	}
	out, err := in.eval(ctx, *e.maxTTL)
	if err != nil {
		return false, in.refusal(e.Name, *e.maxTTL, err)
	}
	maxTTL := out.(types.Duration).Duration
	if maxTTL <= 0 {
		return false, &issuance.PolicyError{Policy: e.Name, Message: fmt.Sprintf("maxTTL is %v: no certificate is short enough", maxTTL)}
	}
	if maxTTL >= in.ttl || (v.MaxTTL > 0 && maxTTL >= v.MaxTTL) {
		return false, nil // lowers nothing
	}
	v.MaxTTL = maxTTL
	v.Lowered = append(v.Lowered, e.Name)
	e.counts.ttlCapped.Add(1)
	return true, nil
}

func unavailable(policy string, err error) error {
	return &issuance.PolicyError{Policy: policy, Message: err.Error(), Err: issuance.ErrPolicyUnavailable}
}

// input is a request as the expressions see it: their activation. The
// labels are looked up when an expression first reads them.
type input struct {
	door     string
	r        *issuance.Request
	identity string
	td       string
	ns, sa   string
	ttl      time.Duration
	labels   Labels

	nsLabels, nodeLabels ref.Val
	vals                 [len(scalarVariables)]ref.Val
	nsSet                labels.Set
	nsLoaded             bool
	// lookupErr is why labels the expression being evaluated read are
	// not known.
	lookupErr error
	// cost is what the expressions evaluated for the request cost.
	cost uint64
}

func newInput(door string, r *issuance.Request, granted spiffeid.ID, l Labels, ttl time.Duration) *input {
	in := &input{door: door, r: r, identity: granted.String(), td: granted.TrustDomain().Name(), labels: l, ttl: ttl}
	in.ns, in.sa, _ = authz.SplitWorkload(granted)
	return in
}

// ResolveName gives an expression a variable (interpreter.Activation).
// Each is made a value once per request (boxing a string allocates), and
// the labels are looked up when first read.
func (in *input) ResolveName(name string) (any, bool) {
	switch name {
	case "namespaceLabels":
		return in.lookup(&in.nsLabels, func() (map[string]string, error) { return in.labels.NamespaceLabels(in.r.Cluster, in.ns) })
	case "nodeLabels":
		return in.lookup(&in.nodeLabels, func() (map[string]string, error) { return in.labels.NodeLabels(in.r.Cluster, in.r.Caller.NodeName) })
	}
	i := variableIndex(name)
	if i < 0 {
		return nil, false
	}
	if in.vals[i] == nil {
		in.vals[i] = in.value(name)
	}
	return in.vals[i], true
}

// value is the variable name of the request.
func (in *input) value(name string) ref.Val {
	if name == "ttl" {
		return types.Duration{Duration: in.ttl}
	}
	return types.String(in.str(variableIndex(name)))
}

// str is the string variable scalarVariables[i] of the request.
func (in *input) str(i int) string {
	switch scalarVariables[i] {
	case "door":
		return in.door
	case "cluster":
		return in.r.Cluster
	case "callerKind":
		return string(in.r.CallerKind)
	case "callerNamespace":
		return in.r.Caller.Namespace
	case "callerServiceAccount":
		return in.r.Caller.ServiceAccount
	case "credential":
		return string(in.r.Credential)
	case "identity":
		return in.identity
	case "trustDomain":
		return in.td
	case "identityNamespace":
		return in.ns
	case "identityServiceAccount":
		return in.sa
	case "pod":
		return in.r.Caller.PodName
	case "node":
		return in.r.Caller.NodeName
	}
	return ""
}

// Parent is nil: in is the only activation (interpreter.Activation).
func (in *input) Parent() interpreter.Activation { return nil }

func (in *input) lookup(cached *ref.Val, get func() (map[string]string, error)) (any, bool) {
	if *cached == nil {
		m, err := get()
		if err != nil {
			in.lookupErr = err
			return nil, false
		}
		*cached = types.NewStringStringMap(types.DefaultTypeAdapter, m)
	}
	return *cached, true
}

// namespaceLabels is the labels of the identity's namespace, for a
// namespace selector.
func (in *input) namespaceLabels() (labels.Set, error) {
	if in.nsLoaded || in.ns == "" { // no namespace: an identity in none
		return in.nsSet, nil
	}
	m, err := in.labels.NamespaceLabels(in.r.Cluster, in.ns)
	if err != nil {
		return nil, err
	}
	in.nsSet, in.nsLoaded = labels.Set(m), true // nil if it has none
	return in.nsSet, nil
}

// eval evaluates p against in: a bool, or a time.Duration.
func (in *input) eval(ctx context.Context, p program) (any, error) {
	if in.cost > MaxRequestCost {
		return nil, errRequestCost
	}
	in.lookupErr = nil
	if p.static != nil {
		in.cost += p.maxCost
		return holds(p.static, in), nil
	}
	var out ref.Val
	var err error
	if p.maxCost > 0 {
		// Bounded: no context to watch, no cost to track.
		out, _, err = p.prg.Eval(in)
		in.cost += p.maxCost
	} else {
		var det *cel.EvalDetails
		out, det, err = p.prg.ContextEval(ctx, in)
		if det != nil && det.ActualCost() != nil {
			in.cost += *det.ActualCost()
		}
	}
	if err != nil {
		return nil, err
	}
	if d, ok := out.(types.Duration); ok {
		return d, nil // as it is: its Value() allocates
	}
	return out.Value(), nil
}

var errRequestCost = fmt.Errorf("the policies' expressions cost more than %d for this request", MaxRequestCost)

// refusal is a policy's refusal of a request one of its expressions (p)
// could not evaluate: unavailable when an input it read is not known now,
// a denial when the expression failed (as a ValidatingAdmissionPolicy
// that fails does).
func (in *input) refusal(policy string, p program, err error) error {
	if in.lookupErr != nil {
		return unavailable(policy, fmt.Errorf("%s: %w", p.source, in.lookupErr))
	}
	return &issuance.PolicyError{Policy: policy, Message: issuance.Clip(fmt.Sprintf("%s: %v", p.source, err), maxRefusalMessage)}
}
