package server

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/proto/capb"
)

// Authenticator turns a bearer token into a caller.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (authz.Caller, error)
}

// Authorizer decides which identity a caller gets; a zero requested ID asks
// for the caller's own.
type Authorizer interface {
	Authorize(ctx context.Context, caller authz.Caller, requested spiffeid.ID) (spiffeid.ID, error)
}

// RemoteCluster authenticates and authorizes the callers of another
// cluster, from that cluster's API server alone; Ready fails (with
// authz.ErrUnavailable) while it cannot decide.
type RemoteCluster interface {
	Authenticator
	Authorizer
	Ready() error
}

// ClusterObserver is an Observer that is also told the cluster of every
// request the CA knew the cluster of (Config.ClusterID set).
type ClusterObserver interface {
	ClusterRequestDone(cluster, result string)
}

// Connections is told of each request on a client connection: when it
// starts, and when it ends whether its caller authenticated (ConnGuard).
type Connections interface {
	RequestStarted(ctx context.Context) (done func(authenticated bool))
}

// Signer issues a certificate for a granted identity.
type Signer interface {
	Sign(ctx context.Context, r ca.Request) (*ca.Issued, error)
}

// Observer is told the outcome of every request, for metrics. result and
// reason come from small fixed sets.
type Observer interface {
	RequestDone(result, reason string, d time.Duration)
}

// Config wires the service. Authenticator, Authorizer and Signer are
// required: there is no allow-all mode.
type Config struct {
	Authenticator Authenticator
	Authorizer    Authorizer
	Signer        Signer
	// Ready reports whether the CA can serve (nil: always ready).
	Ready func() error
	// ClusterID, if set, refuses requests whose clusterid header names
	// another cluster (Unauthenticated), unless Remote knows that cluster.
	ClusterID string
	// Remote, if set, returns the remote cluster a clusterid header names:
	// its requests are authenticated and authorized by that cluster's
	// checks alone, never by the local ones. It needs ClusterID.
	Remote func(id string) (RemoteCluster, bool)
	// Audit receives one record per decision, issued or refused (default:
	// Logger). It never sees a token, a key or a CSR.
	Audit    *slog.Logger
	Observer Observer
	Logger   *slog.Logger
	Clock    clock.PassiveClock
	// Connections, if set, hears of each request on its connection.
	Connections Connections
	// MaxConcurrentSigns bounds concurrent CSR checks and signatures
	// (default: GOMAXPROCS). QueueTimeout is the longest a request waits
	// for a slot (default DefaultQueueTimeout); MaxQueued bounds the
	// requests waiting (default DefaultMaxQueued), and MaxQueuedPerNode
	// those from one node (default DefaultMaxQueuedPerNode). A request
	// beyond a bound, or whose turn would come after its deadline, is
	// refused at once with Unavailable and a time to come back.
	MaxConcurrentSigns int
	QueueTimeout       time.Duration
	MaxQueued          int
	MaxQueuedPerNode   int
}

// Defaults of Config's queue bounds.
const (
	// DefaultQueueTimeout is long: ztunnel sends no deadline and retries
	// every refusal with a backoff that grows to minutes, so a request
	// that can be served within half a minute is better queued than
	// refused.
	DefaultQueueTimeout = 30 * time.Second
	// DefaultMaxQueued bounds the memory of waiting requests (each holds
	// its goroutine, stream and CSR: see BenchmarkQueuedRequestMemory).
	DefaultMaxQueued = 65536
	// DefaultMaxQueuedPerNode is eight times ztunnel's eight requests in
	// flight.
	DefaultMaxQueuedPerNode = 64
)

// Service implements IstioCertificateService.
type Service struct {
	capb.UnimplementedIstioCertificateServiceServer
	authn     Authenticator
	authz     Authorizer
	signer    Signer
	ready     func() error
	clusterID string
	remote    func(string) (RemoteCluster, bool)
	audit     *slog.Logger
	obs       Observer
	clock     clock.PassiveClock
	cpu       *cpuLimiter
	refused   refusals
	conns     Connections
	// log takes what is not an audit record: that one could not be
	// written, at most once a second (auditErrLog).
	log         *slog.Logger
	auditErrLog *rate.Limiter
}

// NewService checks the configuration and returns the service.
func NewService(cfg Config) (*Service, error) {
	if cfg.Authenticator == nil || cfg.Authorizer == nil || cfg.Signer == nil {
		return nil, errors.New("server: authenticator, authorizer and signer are required")
	}
	if cfg.Remote != nil && cfg.ClusterID == "" {
		return nil, errors.New("server: remote clusters need the local cluster's id")
	}
	s := &Service{authn: cfg.Authenticator, authz: cfg.Authorizer, signer: cfg.Signer,
		ready: cfg.Ready, clusterID: cfg.ClusterID, remote: cfg.Remote, audit: cfg.Audit, obs: cfg.Observer, clock: cfg.Clock}
	if s.ready == nil {
		s.ready = func() error { return nil }
	}
	if s.audit == nil {
		s.audit = cfg.Logger
	}
	if s.audit == nil {
		s.audit = slog.New(slog.DiscardHandler)
	}
	s.log = cfg.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.auditErrLog = rate.NewLimiter(rate.Every(time.Second), 1)
	if s.obs == nil {
		s.obs = nopObserver{}
	}
	s.conns = cfg.Connections
	if s.conns == nil {
		s.conns = nopConnections{}
	}
	if cfg.MaxConcurrentSigns <= 0 {
		cfg.MaxConcurrentSigns = runtime.GOMAXPROCS(0)
	}
	if cfg.QueueTimeout <= 0 {
		cfg.QueueTimeout = DefaultQueueTimeout
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = DefaultMaxQueued
	}
	if cfg.MaxQueuedPerNode <= 0 {
		cfg.MaxQueuedPerNode = DefaultMaxQueuedPerNode
	}
	s.cpu = newCPULimiter(limiterConfig{n: cfg.MaxConcurrentSigns, wait: cfg.QueueTimeout,
		maxQueued: cfg.MaxQueued, maxPerFlow: cfg.MaxQueuedPerNode})
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	return s, nil
}

// Queued is the number of requests waiting for a signing slot.
func (s *Service) Queued() int { return int(s.cpu.waiting.Load()) }

// decision is what one request came to, for the log and the audit record.
type decision struct {
	// cluster is the caller's cluster, when the CA knows cluster ids.
	cluster string
	// authenticated: the caller's token was accepted.
	authenticated bool
	caller        authz.Caller
	requested     spiffeid.ID
	granted       spiffeid.ID
	issued        *ca.Issued
}

// CreateCertificate authenticates the caller, authorizes the identity, signs
// the CSR and returns [leaf, intermediates..., root bundle].
func (s *Service) CreateCertificate(ctx context.Context, req *capb.IstioCertificateRequest) (*capb.IstioCertificateResponse, error) {
	start := s.clock.Now()
	var d decision
	done := s.conns.RequestStarted(ctx)
	err := s.guard(ctx, req, &d)
	done(d.authenticated)
	o := classify(err)
	if cerr := ctx.Err(); err != nil && cerr != nil {
		// The caller went away or its deadline passed: that, not the
		// step it cut short (a token review that reports the API
		// unavailable, say), is the outcome. The record keeps err.
		o = classify(cerr)
	}
	if aerr := s.record(ctx, d, o, err, s.clock.Since(start)); aerr != nil {
		// Signed, but not handed out: a certificate without its audit
		// record would be one nobody can account for. The CA fails
		// closed while the audit log cannot be written.
		err = fmt.Errorf("%w: %w", errAuditUnwritable, aerr)
		o = classify(err)
		_ = s.record(ctx, d, o, err, s.clock.Since(start))
	}
	if err != nil {
		return nil, refusal(ctx, o)
	}
	return &capb.IstioCertificateResponse{CertChain: d.issued.Chain}, nil
}

// pushbackKey is the trailer gRPC clients with a retry policy read for
// when to retry (gRFC A6); its value is in milliseconds.
const pushbackKey = "grpc-retry-pushback-ms"

// refusal is the status a refused request gets. An overloaded caller is
// also told when to come back: in the grpc-retry-pushback-ms trailer and
// in a google.rpc.RetryInfo detail.
func refusal(ctx context.Context, o outcome) error {
	st := status.New(o.code, o.message)
	if o.retryAfter <= 0 {
		return st.Err()
	}
	// Outside a gRPC stream (a direct call) there is no trailer to set.
	_ = grpc.SetTrailer(ctx, metadata.Pairs(pushbackKey, strconv.FormatInt(o.retryAfter.Milliseconds(), 10)))
	if detailed, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(o.retryAfter)}); err == nil {
		st = detailed
	}
	return st.Err()
}

// errPanic wraps a panic in the request path.
var errPanic = errors.New("panic")

// guard runs createCertificate and turns a panic into an error: a bug
// answers Internal and leaves an audit record with the panic and its
// stack, which the caller never sees (gRPC's recovery interceptor would
// send the stack in the status message).
func (s *Service) guard(ctx context.Context, req *capb.IstioCertificateRequest, d *decision) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v\n%s", errPanic, p, debug.Stack())
		}
	}()
	return s.createCertificate(ctx, req, d)
}

func (s *Service) createCertificate(ctx context.Context, req *capb.IstioCertificateRequest, d *decision) error {
	if err := s.ready(); err != nil {
		return errors.Join(errNotReady, err)
	}
	cl, err := s.clusterOf(metadata.ValueFromIncomingContext(ctx, ClusterIDKey))
	d.cluster = cl.id
	if err != nil {
		return err
	}
	token, err := bearerToken(metadata.ValueFromIncomingContext(ctx, "authorization"))
	if err != nil {
		return err
	}
	// The requested identity is parsed first (cheap, and in the audit
	// record of a caller refused now); its error is reported after
	// authentication, as istiod does: a caller without a valid token
	// learns nothing of its request, and gets no CPU slot for its CSR.
	requested, reqErr := impersonatedIdentity(req)
	d.requested = requested
	if d.caller, err = cl.authn.Authenticate(ctx, token); err != nil {
		return err
	}
	d.authenticated = true
	if reqErr != nil {
		return reqErr
	}
	var csr *x509.CertificateRequest
	flow := flowOf(cl.id, d.caller)
	if err := s.cpu.do(ctx, flow, false, func() (err error) { csr, err = ca.ParseCSR([]byte(req.GetCsr())); return err }); err != nil {
		return err
	}
	if d.granted, err = cl.authz.Authorize(ctx, d.caller, requested); err != nil {
		return err
	}
	return s.cpu.do(ctx, flow, true, func() (err error) {
		d.issued, err = s.signer.Sign(ctx, ca.Request{CSR: csr, ID: d.granted, TTL: seconds(req.GetValidityDuration())})
		return err
	})
}

// flowOf is the share of the signing slots a caller's requests take: its
// node's (a node agent asks for every workload of its node), or else its
// pod's or its service account's; in its cluster (node-1 of one cluster
// is not node-1 of another).
func flowOf(cluster string, c authz.Caller) string {
	switch {
	case c.NodeName != "":
		return "node/" + cluster + "/" + c.NodeName
	case c.PodUID != "":
		return "pod/" + c.PodUID
	}
	return "sa/" + cluster + "/" + c.Namespace + "/" + c.ServiceAccount
}

// cluster is the cluster a request is decided in: its id (when the CA
// knows cluster ids) and its checks.
type cluster struct {
	id    string
	authn Authenticator
	authz Authorizer
}

// clusterOf picks the cluster the clusterid header names: none, or the
// local id, is the local cluster; a remote cluster's id is that cluster,
// refused as unavailable until it can decide. Another id is refused as
// istiod does (its token was issued by an API server this CA cannot ask),
// unless the CA knows no cluster ids at all, when every request is the
// local cluster's. values are the header's values; they must agree (an
// empty value names no cluster this CA serves).
func (s *Service) clusterOf(values []string) (cluster, error) {
	local := cluster{id: s.clusterID, authn: s.authn, authz: s.authz}
	if len(values) == 0 {
		return local, nil
	}
	id := values[0]
	for _, v := range values[1:] {
		if v != id {
			return cluster{}, fmt.Errorf("%w: clusterid headers name clusters %q and %q", authz.ErrUnauthenticated,
				clip(id, maxHeaderValue), clip(v, maxHeaderValue))
		}
	}
	switch {
	case id == s.clusterID || s.clusterID == "":
		return local, nil
	case s.remote != nil:
		if rc, ok := s.remote(id); ok {
			c := cluster{id: id, authn: rc, authz: rc}
			return c, rc.Ready()
		}
		return cluster{}, fmt.Errorf("%w: the client claims cluster %q, which is neither this CA's cluster %q nor a remote cluster it serves",
			authz.ErrUnauthenticated, clip(id, maxHeaderValue), s.clusterID)
	}
	return cluster{}, fmt.Errorf("%w: the client claims cluster %q, this CA serves cluster %q", authz.ErrUnauthenticated, clip(id, maxHeaderValue), s.clusterID)
}

// record writes the audit record of a decision and reports it to the
// observer; refusals that decide nothing, and those of callers who did not
// authenticate, are summarized (see refusals). It never logs the token, a
// key or the CSR, and clips the strings a caller chose (clip). The error is that of writing
// an issuance's record, which the caller must not answer without (the
// observer then hears nothing: the caller records the refusal instead).
func (s *Service) record(ctx context.Context, d decision, o outcome, err error, took time.Duration) error {
	if co, ok := s.obs.(ClusterObserver); ok && d.cluster != "" {
		co.ClusterRequestDone(d.cluster, o.result)
	}
	if err != nil && summarized(o) {
		s.obs.RequestDone(o.result, string(o.reason), took)
		s.refused.add(refusalKey{cluster: d.cluster, caller: d.caller.Namespace + "/" + d.caller.ServiceAccount, node: d.caller.NodeName,
			result: o.result, reason: string(o.reason), code: o.code.String()}, s.clock.Now(), err.Error())
		return nil
	}
	attrs := []slog.Attr{
		slog.String("decision", o.result),
		slog.String("caller", d.caller.Namespace+"/"+d.caller.ServiceAccount),
		slog.String("pod", d.caller.PodName),
		slog.String("node", d.caller.NodeName),
		slog.Float64("took_seconds", took.Seconds()),
	}
	if d.cluster != "" {
		attrs = append(attrs, slog.String("cluster", d.cluster))
	}
	if !d.requested.IsZero() {
		attrs = append(attrs, slog.String("requested", clip(d.requested.String(), maxRecordedID)))
	}
	if err != nil {
		if o.reason != "" {
			attrs = append(attrs, slog.String("reason", string(o.reason)))
		}
		msg := err.Error()
		if o.result != ResultInternal { // a bug's record keeps its whole stack
			msg = clip(msg, maxRecordedError)
		}
		attrs = append(attrs, slog.String("code", o.code.String()), slog.String("error", msg))
		s.obs.RequestDone(o.result, string(o.reason), took)
		if werr := s.writeAudit(ctx, levelFor(o), "certificate request refused", attrs); werr != nil {
			s.auditFailed(ctx, werr)
		}
		return nil
	}
	attrs = append(attrs,
		slog.String("identity", d.granted.String()),
		slog.String("serial", d.issued.Cert.SerialNumber.Text(16)),
		slog.Time("not_after", d.issued.Cert.NotAfter))
	if werr := s.writeAudit(ctx, slog.LevelInfo, "certificate issued", attrs); werr != nil {
		s.auditFailed(ctx, werr)
		return werr
	}
	s.obs.RequestDone(o.result, string(o.reason), took)
	return nil
}

// auditFailed logs, at most once a second, that an audit record could not
// be written.
func (s *Service) auditFailed(ctx context.Context, err error) {
	if s.auditErrLog.AllowN(s.clock.Now(), 1) {
		s.log.ErrorContext(ctx, "audit record not written; certificates are refused until it can be", "error", err.Error())
	}
}

// writeAudit hands one record to the audit handler. Unlike Logger.LogAttrs
// it does not capture the caller's program counter (a stack walk per
// certificate): the record's source is always this function.
func (s *Service) writeAudit(ctx context.Context, level slog.Level, msg string, attrs []slog.Attr) error {
	h := s.audit.Handler()
	if !h.Enabled(ctx, level) {
		return nil
	}
	r := slog.NewRecord(s.clock.Now(), level, msg, 0)
	r.AddAttrs(attrs...)
	return h.Handle(ctx, r)
}

type nopObserver struct{}

type nopConnections struct{}

func (nopConnections) RequestStarted(context.Context) func(bool) { return func(bool) {} }

func (nopObserver) RequestDone(string, string, time.Duration) {}

func levelFor(o outcome) slog.Level {
	if o.result == "internal" {
		return slog.LevelError
	}
	return slog.LevelWarn
}
