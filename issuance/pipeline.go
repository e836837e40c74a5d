package issuance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"
	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/ca"
)

// Signer issues a certificate for a granted identity; *ca.Authority is
// one.
type Signer interface {
	Sign(ctx context.Context, r ca.Request) (*ca.Issued, error)
}

// Observer is told the outcome of every request, for metrics: its door,
// its result and reason (small fixed sets), and how long it took.
type Observer interface {
	RequestDone(door, result, reason string, took time.Duration)
}

// ClusterObserver is an Observer that is also told the cluster of every
// request whose cluster is known (Request.Cluster set).
type ClusterObserver interface {
	ClusterRequestDone(cluster, result string)
}

// Config wires the pipeline. Signer is required.
type Config struct {
	Signer Signer
	// Audit receives one record per decision, issued or refused, and the
	// summaries of refusals that decide nothing (default: Logger). It
	// never sees a token, a key or a CSR.
	Audit    *slog.Logger
	Logger   *slog.Logger
	Observer Observer
	Clock    clock.PassiveClock
	// Policy, if set, decides every request a door's rule granted; nil
	// lets the rule's grant stand.
	Policy Policy
}

// Pipeline authorizes, signs, audits and counts the requests of every
// door.
type Pipeline struct {
	signer  Signer
	policy  Policy
	audit   *slog.Logger
	obs     Observer
	clock   clock.PassiveClock
	refused refusals
	// log takes what is not an audit record: that one could not be
	// written, at most once a second (auditErrLog).
	log         *slog.Logger
	auditErrLog *rate.Limiter
}

// New checks the configuration and returns the pipeline.
func New(cfg Config) (*Pipeline, error) {
	if cfg.Signer == nil {
		return nil, errors.New("issuance: a signer is required")
	}
	p := &Pipeline{signer: cfg.Signer, policy: cfg.Policy, audit: cfg.Audit, obs: cfg.Observer, clock: cfg.Clock, log: cfg.Logger}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.audit == nil {
		p.audit = p.log
	}
	if p.obs == nil {
		p.obs = nopObserver{}
	}
	if p.clock == nil {
		p.clock = clock.RealClock{}
	}
	p.auditErrLog = rate.NewLimiter(rate.Every(time.Second), 1)
	return p, nil
}

type nopObserver struct{}

func (nopObserver) RequestDone(string, string, string, time.Duration) {}

// Door is one front door's way into the pipeline.
type Door struct {
	p    *Pipeline
	name string
	// answer is what the door answers a refusal with (a gRPC code, a
	// condition's reason), for the record's code.
	answer func(Outcome, error) string
}

// Door returns the way in of the door called name (a Door* constant, the
// records' door and the metrics' door label); answer says what the door
// answers a refusal with, given its outcome and its error (the caller's
// ended context's, when that decided the outcome), for the records (nil:
// nothing).
func (p *Pipeline) Door(name string, answer func(o Outcome, err error) string) *Door {
	if answer == nil {
		answer = func(Outcome, error) string { return "" }
	}
	return &Door{p: p, name: name, answer: answer}
}

// Issue decides r: the identity rule grants it, signed within r's bounds.
// Whatever the result, it is recorded and counted; a certificate whose
// audit record cannot be written is not returned (ErrAuditUnwritable).
// The error is the refusal's, for Classify and the door's answer.
func (d *Door) Issue(ctx context.Context, r Request, rule Rule) (*ca.Issued, error) {
	if r.Received.IsZero() {
		r.Received = d.p.clock.Now()
	}
	var v Verdict
	granted, issued, err := d.decide(ctx, &r, rule, &v)
	if err != nil {
		_ = d.record(ctx, &r, granted, &v, nil, err)
		return nil, err
	}
	if werr := d.record(ctx, &r, granted, &v, issued, nil); werr != nil {
		// Signed, but not handed out: a certificate without its audit
		// record would be one nobody can account for. The CA fails
		// closed while the audit log cannot be written.
		err = fmt.Errorf("%w: %w", ErrAuditUnwritable, werr)
		_ = d.record(ctx, &r, granted, &v, nil, err)
		return nil, err
	}
	return issued, nil
}

// decide grants, asks the policy (its verdict into v) and signs; a panic
// becomes an error (ErrPanic, with its stack for the record, never for the
// caller).
func (d *Door) decide(ctx context.Context, r *Request, rule Rule, v *Verdict) (granted spiffeid.ID, issued *ca.Issued, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			issued, err = nil, fmt.Errorf("%w: %v\n%s", ErrPanic, rec, debug.Stack())
		}
	}()
	if granted, err = rule.Grant(ctx, r); err != nil {
		return granted, nil, err
	}
	if d.p.policy != nil {
		if *v, err = d.p.policy.Decide(ctx, d.name, r, granted); err != nil {
			return granted, nil, err
		}
		if v.MaxTTL > 0 && v.MaxTTL < r.MinValidity {
			// Signing would only make a certificate the door cannot
			// hand out, again at every retry.
			return granted, nil, &PolicyError{Policy: strings.Join(v.Lowered, ","),
				Message: fmt.Sprintf("it caps the lifetime at %v, under the %v the %s door must hand out", v.MaxTTL, r.MinValidity, d.name)}
		}
	}
	maxTTL := v.MaxTTL // not v itself: the closure escapes, and would take v with it
	sign := func() (err error) {
		issued, err = d.p.signer.Sign(ctx, ca.Request{CSR: r.CSR, ID: granted, TTL: r.TTL, MaxValidity: r.MaxValidity, MaxTTL: maxTTL})
		return err
	}
	if r.Admit != nil {
		err = r.Admit(ctx, sign)
	} else {
		err = sign()
	}
	if err != nil {
		return granted, nil, err
	}
	if life := issued.Cert.NotAfter.Sub(issued.Cert.NotBefore); life < r.MinValidity {
		return granted, nil, fmt.Errorf("%w: it is valid for %v, until %s; the %s door hands out at least %v (is the signing certificate about to expire?)",
			ErrTooShort, life, issued.Cert.NotAfter.UTC().Format(time.RFC3339), d.name, r.MinValidity)
	}
	return granted, issued, nil
}

// Refuse records a request the door refused before it could be decided
// (its caller did not authenticate, the CA is not ready, the request is
// malformed), in the same format as the decisions.
func (d *Door) Refuse(ctx context.Context, r Request, err error) {
	if r.Received.IsZero() {
		r.Received = d.p.clock.Now()
	}
	_ = d.record(ctx, &r, spiffeid.ID{}, nil, nil, err)
}

// record writes the audit record of a decision and reports it to the
// observer; refusals that decide nothing, and those of callers who did
// not authenticate, are summarized (see refusals). It never logs the
// token, a key or the CSR, and clips the strings a caller chose (Clip).
// The error is that of writing an issuance's record, which the door must
// not hand out the certificate without (the observer then hears nothing:
// Issue records the refusal instead).
func (d *Door) record(ctx context.Context, r *Request, granted spiffeid.ID, v *Verdict, issued *ca.Issued, err error) error {
	p := d.p
	o := Classify(ctx, err)
	took := p.clock.Since(r.Received)
	answered := err
	if err != nil && ctx.Err() != nil {
		answered = ctx.Err()
	}
	caller := r.Caller.Namespace + "/" + r.Caller.ServiceAccount
	if err != nil && o.summarized() {
		d.count(r, o, took)
		p.refused.add(refusalKey{door: d.name, cluster: r.Cluster, caller: caller, node: r.Caller.NodeName,
			result: o.Result, reason: o.Reason, code: d.answer(o, answered)}, p.clock.Now(), err.Error())
		return nil
	}
	attrs := d.attrs(r, o, v, took, err)
	if err != nil {
		if o.Reason != "" {
			attrs = append(attrs, slog.String("reason", o.Reason))
		}
		msg := err.Error()
		if o.Result != ResultInternal { // a bug's record keeps its whole stack
			msg = Clip(msg, maxRecordedError)
		}
		attrs = append(attrs, slog.String("code", d.answer(o, answered)), slog.String("error", msg))
		d.count(r, o, took)
		level := slog.LevelWarn
		if o.Result == ResultInternal {
			level = slog.LevelError
		}
		if werr := p.writeAudit(ctx, level, msgRefused, attrs); werr != nil {
			p.auditFailed(ctx, werr)
		}
		return nil
	}
	attrs = append(attrs,
		slog.String("identity", granted.String()),
		slog.String("serial", issued.Cert.SerialNumber.Text(16)),
		slog.Time("not_after", issued.Cert.NotAfter))
	if werr := p.writeAudit(ctx, slog.LevelInfo, msgIssued, attrs); werr != nil {
		p.auditFailed(ctx, werr)
		return werr
	}
	d.count(r, o, took)
	return nil
}

// count tells the observer of one request's outcome, once per request.
func (d *Door) count(r *Request, o Outcome, took time.Duration) {
	d.p.obs.RequestDone(d.name, o.Result, o.Reason, took)
	if co, ok := d.p.obs.(ClusterObserver); ok && r.Cluster != "" {
		co.ClusterRequestDone(r.Cluster, o.Result)
	}
}

// attrs are what every record of r says: who asked, at which door, in
// which cluster, for what, and what the policies decided.
func (d *Door) attrs(r *Request, o Outcome, v *Verdict, took time.Duration, err error) []slog.Attr {
	caller := r.Caller.Namespace + "/" + r.Caller.ServiceAccount
	attrs := make([]slog.Attr, 0, 16)
	attrs = append(attrs,
		slog.String("door", d.name),
		slog.String("decision", o.Result),
		slog.String("caller", caller),
		slog.String("pod", r.Caller.PodName),
		slog.String("node", r.Caller.NodeName),
		slog.Float64("took_seconds", took.Seconds()))
	if r.CallerKind != "" {
		attrs = append(attrs, slog.String("caller_kind", string(r.CallerKind)))
	}
	if r.Cluster != "" {
		attrs = append(attrs, slog.String("cluster", r.Cluster))
	}
	if r.Object != "" {
		attrs = append(attrs, slog.String("object", r.Object))
	}
	if !r.Requested.IsZero() {
		attrs = append(attrs, slog.String("requested", Clip(r.Requested.String(), maxRecordedID)))
	}
	return appendPolicy(attrs, v, err)
}

// appendPolicy adds what issuance policies decided of a request to its
// record: the policy that refused it, or those that lowered its lifetime,
// and those that would have refused it were they not in dry-run mode.
func appendPolicy(attrs []slog.Attr, v *Verdict, err error) []slog.Attr {
	if err != nil {
		if pe := (*PolicyError)(nil); errors.As(err, &pe) {
			attrs = append(attrs, slog.String("policy", pe.Policy))
		}
	}
	switch {
	case err != nil:
	case v != nil && len(v.Lowered) > 0:
		attrs = append(attrs, slog.String("policy", strings.Join(v.Lowered, ",")))
	}
	if v != nil && len(v.WouldDeny) > 0 {
		attrs = append(attrs, slog.String("policy_dry_run_denied", strings.Join(v.WouldDeny, ",")))
	}
	return attrs
}
