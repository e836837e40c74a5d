package server

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/issuance"
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

// Connections is told of each request on a client connection: when it
// starts, and when it ends whether its caller authenticated (ConnGuard).
type Connections interface {
	RequestStarted(ctx context.Context) (done func(authenticated bool))
}

// Config wires the service. Authenticator, Authorizer and Pipeline are
// required: there is no allow-all mode.
type Config struct {
	Authenticator Authenticator
	Authorizer    Authorizer
	// Pipeline decides, signs, audits and counts what this door hands it:
	// the one every door shares.
	Pipeline *issuance.Pipeline
	// Ready reports whether the CA can serve (nil: always ready).
	Ready func() error
	// ClusterID, if set, refuses requests whose clusterid header names
	// another cluster (Unauthenticated), unless Remote knows that cluster.
	ClusterID string
	// Remote, if set, returns the remote cluster a clusterid header names:
	// its requests are authenticated and authorized by that cluster's
	// checks alone, never by the local ones. It needs ClusterID.
	Remote func(id string) (RemoteCluster, bool)
	Clock  clock.PassiveClock
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

// Service implements IstioCertificateService: the gRPC door of the
// issuance pipeline.
type Service struct {
	capb.UnimplementedIstioCertificateServiceServer
	authn     Authenticator
	authz     Authorizer
	pipeline  *issuance.Pipeline
	door      *issuance.Door
	ready     func() error
	clusterID string
	remote    func(string) (RemoteCluster, bool)
	clock     clock.PassiveClock
	cpu       *cpuLimiter
	conns     Connections
}

// NewService checks the configuration and returns the service.
func NewService(cfg Config) (*Service, error) {
	if cfg.Authenticator == nil || cfg.Authorizer == nil || cfg.Pipeline == nil {
		return nil, errors.New("server: authenticator, authorizer and pipeline are required")
	}
	if cfg.Remote != nil && cfg.ClusterID == "" {
		return nil, errors.New("server: remote clusters need the local cluster's id")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	s := &Service{authn: cfg.Authenticator, authz: cfg.Authorizer, pipeline: cfg.Pipeline,
		ready: cfg.Ready, clusterID: cfg.ClusterID, remote: cfg.Remote, clock: cfg.Clock}
	s.door = s.pipeline.Door(issuance.DoorGRPC, answer)
	if s.ready == nil {
		s.ready = func() error { return nil }
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
	return s, nil
}

// Queued is the number of requests waiting for a signing slot.
func (s *Service) Queued() int { return int(s.cpu.waiting.Load()) }

// CreateCertificate authenticates the caller and hands the request to
// the pipeline, which authorizes the identity, signs the CSR and records
// the decision; it returns [leaf, intermediates..., root bundle].
func (s *Service) CreateCertificate(ctx context.Context, req *capb.IstioCertificateRequest) (*capb.IstioCertificateResponse, error) {
	r := issuance.Request{Received: s.clock.Now(), Credential: issuance.CredentialX509SVID}
	var authenticated bool
	done := s.conns.RequestStarted(ctx)
	defer func() { done(authenticated) }()
	issued, err := s.guard(ctx, req, &r, &authenticated)
	if err != nil {
		return nil, refusal(ctx, classify(ctx, err))
	}
	return &capb.IstioCertificateResponse{CertChain: issued.Chain}, nil
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

// guard runs createCertificate and turns a panic into an error: a bug
// answers Internal and leaves an audit record with the panic and its
// stack, which the caller never sees (gRPC's recovery interceptor would
// send the stack in the status message).
// A panic once the request is with the pipeline (in its audit handler or
// observer) is not recorded again: the pipeline was recording it.
func (s *Service) guard(ctx context.Context, req *capb.IstioCertificateRequest, r *issuance.Request, authenticated *bool) (issued *ca.Issued, err error) {
	handedOver := false
	defer func() {
		if p := recover(); p != nil {
			issued, err = nil, fmt.Errorf("%w: %v\n%s", issuance.ErrPanic, p, debug.Stack())
			if !handedOver {
				s.door.Refuse(ctx, *r, err)
			}
		}
	}()
	return s.createCertificate(ctx, req, r, authenticated, &handedOver)
}

// createCertificate turns the gRPC request into r, authenticating its
// caller in the cluster it names, and hands it to the pipeline; what it
// refuses before then it records through the door too.
func (s *Service) createCertificate(ctx context.Context, req *capb.IstioCertificateRequest, r *issuance.Request, authenticated, handedOver *bool) (*ca.Issued, error) {
	refuse := func(err error) (*ca.Issued, error) {
		*handedOver = true
		s.door.Refuse(ctx, *r, err)
		return nil, err
	}
	if err := s.ready(); err != nil {
		return refuse(errors.Join(issuance.ErrNotReady, err))
	}
	cl, err := s.clusterOf(metadata.ValueFromIncomingContext(ctx, ClusterIDKey))
	r.Cluster = cl.id
	if err != nil {
		return refuse(err)
	}
	token, err := bearerToken(metadata.ValueFromIncomingContext(ctx, "authorization"))
	if err != nil {
		return refuse(err)
	}
	// The requested identity is parsed first (cheap, and in the audit
	// record of a caller refused now); its error is reported after
	// authentication, as istiod does: a caller without a valid token
	// learns nothing of its request, and gets no CPU slot for its CSR.
	requested, reqErr := impersonatedIdentity(req)
	r.Requested = requested
	if r.Caller, err = cl.authn.Authenticate(ctx, token); err != nil {
		return refuse(err)
	}
	*authenticated = true
	r.CallerKind = issuance.CallerWorkload
	if !requested.IsZero() && !r.Caller.Owns(requested) {
		r.CallerKind = issuance.CallerNodeAgent
	}
	if reqErr != nil {
		return refuse(reqErr)
	}
	flow := flowOf(cl.id, r.Caller)
	if err := s.cpu.do(ctx, flow, false, func() (err error) { r.CSR, err = ca.ParseCSR([]byte(req.GetCsr())); return err }); err != nil {
		return refuse(err)
	}
	r.TTL = seconds(req.GetValidityDuration())
	r.Admit = func(ctx context.Context, sign func() error) error { return s.cpu.do(ctx, flow, true, sign) }
	*handedOver = true
	return s.door.Issue(ctx, *r, cl)
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

// Grant is the node rule of the cluster's checks (issuance.Rule).
func (c cluster) Grant(ctx context.Context, r *issuance.Request) (spiffeid.ID, error) {
	return c.authz.Authorize(ctx, r.Caller, r.Requested)
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
				issuance.Clip(id, issuance.MaxHeaderValue), issuance.Clip(v, issuance.MaxHeaderValue))
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
			authz.ErrUnauthenticated, issuance.Clip(id, issuance.MaxHeaderValue), s.clusterID)
	}
	return cluster{}, fmt.Errorf("%w: the client claims cluster %q, this CA serves cluster %q", authz.ErrUnauthenticated, issuance.Clip(id, issuance.MaxHeaderValue), s.clusterID)
}

type nopConnections struct{}

func (nopConnections) RequestStarted(context.Context) func(bool) { return func(bool) {} }

// RunAudit writes the pipeline's summaries of refusals that decide
// nothing every interval until ctx ends (issuance.Pipeline.RunAudit).
func (s *Service) RunAudit(ctx context.Context, interval time.Duration) {
	s.pipeline.RunAudit(ctx, interval)
}

// FlushAudit writes the summaries counted so far.
func (s *Service) FlushAudit() { s.pipeline.FlushAudit() }
