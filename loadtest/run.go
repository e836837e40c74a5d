package loadtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/proto/capb"
)

// Defaults applied by Run to zero Config fields.
const (
	DefaultInFlight         = 8
	DefaultTimeout          = 10 * time.Second
	DefaultTTL              = 24 * time.Hour
	DefaultCSRsPerIdentity  = 2
	DefaultProgressInterval = time.Second
	DefaultOnceDeadline     = time.Minute
)

// Storm retry policies (Config.Retry).
const (
	// RetryZtunnel retries each identity after ztunnel's backoff: about
	// a second, doubling up to 150s, with 20% jitter either way.
	RetryZtunnel = "ztunnel"
	// RetryAggressive retries at once, as a misbehaving client would.
	RetryAggressive = "aggressive"
)

// ztunnel's backoff (its secret manager's, per identity).
const (
	backoffInitial = time.Second
	backoffMax     = 150 * time.Second
	backoffJitter  = 0.2
)

// Error classes that are not gRPC codes.
const (
	// ErrInvalidResponse counts responses that do not check (leaf SAN,
	// chain shape), as ztunnel would reject them.
	ErrInvalidResponse = "InvalidResponse"
	// ErrClientBacklog counts requests of an open-loop run that could not
	// even be queued: the client fell that far behind.
	ErrClientBacklog = "ClientBacklog"
)

// queueDepth bounds each ztunnel's queue of due requests in open loop.
const queueDepth = 4096

// Config is one load test.
type Config struct {
	Plan Plan
	// Address is host:port of the CA.
	Address string
	// Roots verify the CA's serving certificate; ServerName overrides the
	// name checked (default: the host of Address).
	Roots      *x509.CertPool
	ServerName string
	// DialOptions are added to every connection's options (tests).
	DialOptions []grpc.DialOption

	// Warmup runs before the measured window of Duration. In Once mode
	// Duration is the deadline of the whole storm (default 1m) and Warmup
	// is ignored.
	Warmup, Duration time.Duration
	// Rate is the total target rate in requests per second; 0 runs closed
	// loop at the maximum rate.
	Rate float64
	// Once runs a cold-start storm instead (see the package comment).
	Once bool
	// Retry is how a storm retries a failed request: RetryZtunnel (the
	// default), per identity after ztunnel's backoff, or RetryAggressive,
	// at once.
	Retry string
	// Hold keeps a storm's connections open, idle, for this long after
	// the last ztunnel is done (to measure what idle connections cost the
	// CA).
	Hold time.Duration
	// InFlight bounds outstanding requests per ztunnel (default 8).
	InFlight int
	// Timeout is each request's deadline (default 10s), and bounds
	// connecting. A storm's requests have none, as ztunnel's do not.
	Timeout time.Duration
	// TTL is the requested lifetime (default 24h).
	TTL time.Duration
	// CSRsPerIdentity is the size of each identity's pool of pregenerated
	// CSRs (default 2).
	CSRsPerIdentity int
	// NoCheck skips checking responses (leaf parse and SAN match).
	NoCheck bool
	// Progress, if set, receives a line every ProgressInterval (default 1s).
	Progress         io.Writer
	ProgressInterval time.Duration
}

func (c *Config) setDefaults() error {
	if err := c.Plan.validate(); err != nil {
		return err
	}
	if c.Roots == nil || c.Address == "" {
		return errors.New("loadtest: Address and Roots are required")
	}
	if c.Rate < 0 || c.Warmup < 0 || c.Duration < 0 {
		return errors.New("loadtest: Rate, Warmup and Duration must not be negative")
	}
	if c.Once {
		c.Warmup, c.Rate = 0, 0
		if c.Duration == 0 {
			c.Duration = DefaultOnceDeadline
		}
	} else if c.Duration == 0 {
		return errors.New("loadtest: Duration is required")
	}
	switch c.Retry {
	case "":
		c.Retry = RetryZtunnel
	case RetryZtunnel, RetryAggressive:
	default:
		return fmt.Errorf("loadtest: Retry %q: want %s or %s", c.Retry, RetryZtunnel, RetryAggressive)
	}
	c.InFlight = orDefault(c.InFlight, DefaultInFlight)
	c.Timeout = orDefault(c.Timeout, DefaultTimeout)
	c.TTL = orDefault(c.TTL, DefaultTTL)
	c.CSRsPerIdentity = orDefault(c.CSRsPerIdentity, DefaultCSRsPerIdentity)
	c.ProgressInterval = orDefault(c.ProgressInterval, DefaultProgressInterval)
	return nil
}

func orDefault[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Summary is the outcome of a run. Rates and percentiles cover the
// measured window only (the whole storm in Once mode).
type Summary struct {
	Mode       string  `json:"mode"` // "max", "rate" or "once"
	Ztunnels   int     `json:"ztunnels"`
	Identities int     `json:"identities"`
	InFlight   int     `json:"in_flight_per_ztunnel"`
	TargetRate float64 `json:"target_rate,omitempty"`

	SetupSeconds  float64   `json:"setup_seconds"` // keys, CSRs and (not Once) connections
	WarmupSeconds float64   `json:"warmup_seconds"`
	WindowSeconds float64   `json:"window_seconds"`
	WindowStart   time.Time `json:"window_start"`
	WindowEnd     time.Time `json:"window_end"`

	Certs        uint64            `json:"certs"`
	Errors       uint64            `json:"errors"`
	ErrorsByCode map[string]uint64 `json:"errors_by_code"`
	// ErrorSamples holds the first error message of each code.
	ErrorSamples map[string]string `json:"error_samples,omitempty"`
	CertsPerSec  float64           `json:"certs_per_sec"`
	LatencyMS    Latency           `json:"latency_ms"`
	// Rate mode: how late requests were sent after they were due, which
	// their latency includes (it counts from the due time). A large lag
	// means this process, not the CA, was short of CPU.
	StartLagMS *Latency `json:"start_lag_ms,omitempty"`

	// Once mode: when every ztunnel held all its certificates (zero if
	// some never did), how many did, and when the median one did.
	AllDoneSeconds     float64 `json:"all_done_seconds,omitempty"`
	ZtunnelsDone       int     `json:"ztunnels_done,omitempty"`
	ZtunnelDoneP50Secs float64 `json:"ztunnel_done_p50_seconds,omitempty"`
	// Once mode: how the storm retried, and the certificates and errors
	// of each second of it (the goodput curve).
	Retry           string    `json:"retry,omitempty"`
	CertsPerSecond  []uint64  `json:"certs_per_second,omitempty"`
	ErrorsPerSecond []uint64  `json:"errors_per_second,omitempty"`
	HoldStart       time.Time `json:"hold_start,omitzero"`
	HoldEnd         time.Time `json:"hold_end,omitzero"`
}

// Latency percentiles in milliseconds.
type Latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99_9"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

func latencyOf(h *Histogram) Latency {
	return Latency{P50: ms(h.Quantile(0.50)), P90: ms(h.Quantile(0.90)), P99: ms(h.Quantile(0.99)),
		P999: ms(h.Quantile(0.999)), Max: ms(h.Max()), Mean: ms(h.Mean())}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ztunnel is one simulated node agent.
type ztunnel struct {
	ctx    context.Context // the run's, with the bearer token as outgoing metadata
	conn   *grpc.ClientConn
	client capb.IstioCertificateServiceClient
	ids    []spiffeid.ID
	reqs   [][]*capb.IstioCertificateRequest // per identity, a pool
	next   atomic.Uint64
	queue  chan time.Time // open loop: due times
	doneAt time.Duration  // Once: when it held every certificate
}

// request returns the n-th request of the round-robin over identities,
// then CSR pools, and the identity it asks for.
func (z *ztunnel) request(n uint64) (*capb.IstioCertificateRequest, spiffeid.ID) {
	i := n % uint64(len(z.ids))
	pool := z.reqs[i]
	return pool[(n/uint64(len(z.ids)))%uint64(len(pool))], z.ids[i]
}

// runner is the state of one Run.
type runner struct {
	cfg     Config
	zts     []*ztunnel
	runCtx  context.Context
	start   time.Time
	winFrom time.Time
	winTo   time.Time

	lat     Histogram // successful requests completed in the window
	lag     Histogram // rate mode: due time to sending, of the same requests
	certs   atomic.Uint64
	codes   [codes.Unauthenticated + 1]atomic.Uint64
	other   sync.Map // error class -> *atomic.Uint64
	samples sync.Map // error class or code -> first message

	allOK   atomic.Uint64 // every completion, for progress
	allErrs atomic.Uint64

	stormTook time.Duration // Once: until the last ztunnel finished or gave up
	// Once: completions in each second of the storm.
	okPerSec, errPerSec []atomic.Uint64
	holdFrom, holdTo    time.Time
}

// Run runs the load test described by cfg until it is done or ctx ends,
// and summarizes it. Setup failures (bad configuration, connections that
// never become ready) are errors; request failures are counted.
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	began := time.Now()
	r := &runner{cfg: cfg}
	if err := r.prepare(); err != nil {
		return nil, err
	}
	defer r.close()
	if !cfg.Once {
		if err := r.connectAll(ctx); err != nil {
			return nil, err
		}
	}
	setup := time.Since(began)

	r.start = time.Now()
	r.winFrom = r.start.Add(cfg.Warmup)
	r.winTo = r.winFrom.Add(cfg.Duration)
	var cancel context.CancelFunc
	r.runCtx, cancel = context.WithDeadline(ctx, r.winTo)
	defer cancel()
	// Requests do not inherit the run's deadline: it would travel to the
	// server as grpc-timeout and come back as DeadlineExceeded that cannot
	// be told from a real one. They are cancelled once the run is over.
	reqCtx, cancelRequests := context.WithCancel(ctx)
	defer cancelRequests()
	stop := context.AfterFunc(r.runCtx, cancelRequests)
	defer stop()
	for i, z := range r.zts {
		cluster := cfg.Plan[i].ClusterID
		if cluster == "" {
			cluster = caclient.DefaultClusterID
		}
		z.ctx = metadata.AppendToOutgoingContext(reqCtx,
			"authorization", "Bearer "+cfg.Plan[i].Token, "clusterid", cluster)
	}
	stopProgress := r.progress()
	switch {
	case cfg.Once:
		secs := int(cfg.Duration/time.Second) + 1
		r.okPerSec, r.errPerSec = make([]atomic.Uint64, secs), make([]atomic.Uint64, secs)
		r.storm()
		r.stormTook = time.Since(r.start)
		r.hold(ctx)
	case cfg.Rate > 0:
		r.openLoop()
	default:
		r.closedLoop()
	}
	stopProgress()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return r.summary(setup), nil
}

// prepare generates the keys and CSRs and creates the connections (which
// connect lazily).
func (r *runner) prepare() error {
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: r.cfg.Roots, ServerName: r.cfg.ServerName}
	// Fixed flow-control windows with hyper's defaults, as ztunnel's HTTP/2
	// client has them: no bandwidth-estimation pings.
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithStaticStreamWindowSize(2 << 20), grpc.WithStaticConnWindowSize(5 << 20)}, r.cfg.DialOptions...)
	type job struct{ z, i int }
	var jobs []job
	for zi, p := range r.cfg.Plan {
		z := &ztunnel{ids: make([]spiffeid.ID, len(p.Identities)), reqs: make([][]*capb.IstioCertificateRequest, len(p.Identities))}
		for i, s := range p.Identities {
			z.ids[i] = spiffeid.RequireFromString(s) // validated
			jobs = append(jobs, job{zi, i})
		}
		if r.cfg.Rate > 0 {
			z.queue = make(chan time.Time, queueDepth)
		}
		conn, err := grpc.NewClient(r.cfg.Address, opts...)
		if err != nil {
			r.close()
			return fmt.Errorf("loadtest: %w", err)
		}
		z.conn, z.client = conn, capb.NewIstioCertificateServiceClient(conn)
		r.zts = append(r.zts, z)
	}
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for _, j := range jobs {
		g.Go(func() error {
			z := r.zts[j.z]
			pool, err := r.requestsFor(z.ids[j.i])
			z.reqs[j.i] = pool
			return err
		})
	}
	if err := g.Wait(); err != nil {
		r.close()
		return err
	}
	return nil
}

// requestsFor makes the pool of requests for one identity, each with its
// own P-256 key.
func (r *runner) requestsFor(id spiffeid.ID) ([]*capb.IstioCertificateRequest, error) {
	pool := make([]*capb.IstioCertificateRequest, r.cfg.CSRsPerIdentity)
	md := &structpb.Struct{Fields: map[string]*structpb.Value{"ImpersonatedIdentity": structpb.NewStringValue(id.String())}}
	for i := range pool {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		csr, err := caclient.NewCSR(key, id)
		if err != nil {
			return nil, fmt.Errorf("loadtest: CSR for %s: %w", id, err)
		}
		pool[i] = &capb.IstioCertificateRequest{Csr: string(csr), ValidityDuration: int64(r.cfg.TTL / time.Second), Metadata: md}
	}
	return pool, nil
}

func (r *runner) close() {
	for _, z := range r.zts {
		_ = z.conn.Close()
	}
}

// connectAll connects every ztunnel and waits until all are ready, so that
// TLS handshakes happen before the clock starts.
func (r *runner) connectAll(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	var g errgroup.Group
	for i, z := range r.zts {
		g.Go(func() error {
			z.conn.Connect()
			for {
				s := z.conn.GetState()
				if s == connectivity.Ready {
					return nil
				}
				if !z.conn.WaitForStateChange(ctx, s) {
					return fmt.Errorf("loadtest: ztunnel %d: connection to %s not ready (%s): %w", i, r.cfg.Address, s, ctx.Err())
				}
			}
		})
	}
	return g.Wait()
}

// send makes the n-th request of z and checks the response. It returns
// when the answer arrived: latency ends there, not after the client's own
// check of the certificates.
func (r *runner) send(z *ztunnel, n uint64) (time.Time, error) {
	req, id := z.request(n)
	ctx, cancel := z.ctx, context.CancelFunc(func() {})
	if !r.cfg.Once { // ztunnel sends no deadline
		ctx, cancel = context.WithTimeout(z.ctx, r.cfg.Timeout)
	}
	defer cancel()
	resp, err := z.client.CreateCertificate(ctx, req)
	answered := time.Now()
	if err != nil || r.cfg.NoCheck {
		return answered, err
	}
	if _, err := caclient.CheckResponse(resp.GetCertChain(), id); err != nil {
		return answered, &classError{class: ErrInvalidResponse, err: err}
	}
	return answered, nil
}

// classError is a failure that is not a gRPC status.
type classError struct {
	class string
	err   error
}

func (e *classError) Error() string { return e.class + ": " + e.err.Error() }
func (e *classError) Unwrap() error { return e.err }

// record counts one completed request that was due (or started) at due,
// and reports whether it was a success counted in the window.
func (r *runner) record(due, end time.Time, err error) bool {
	if err != nil {
		if r.runCtx.Err() != nil && !r.cfg.Once {
			return false // cut off by the end of the run
		}
		r.allErrs.Add(1)
	} else {
		r.allOK.Add(1)
	}
	if r.cfg.Once {
		perSec := r.okPerSec
		if err != nil {
			perSec = r.errPerSec
		}
		if sec := int(end.Sub(r.start) / time.Second); sec >= 0 && sec < len(perSec) {
			perSec[sec].Add(1)
		}
	}
	if !r.cfg.Once && (end.Before(r.winFrom) || !end.Before(r.winTo)) {
		return false
	}
	if err == nil {
		r.certs.Add(1)
		r.lat.Record(end.Sub(due))
		return true
	}
	r.countError(err)
	return false
}

func (r *runner) countError(err error) {
	var ce *classError
	if errors.As(err, &ce) {
		r.samples.LoadOrStore(ce.class, err.Error())
		r.countClass(ce.class)
		return
	}
	c := status.Code(err)
	r.samples.LoadOrStore(c.String(), err.Error())
	if int(c) < len(r.codes) {
		r.codes[c].Add(1)
		return
	}
	r.countClass(c.String())
}

func (r *runner) countClass(class string) {
	v, _ := r.other.LoadOrStore(class, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(1)
}

// closedLoop keeps InFlight requests outstanding on every ztunnel.
func (r *runner) closedLoop() {
	var wg sync.WaitGroup
	for _, z := range r.zts {
		for range r.cfg.InFlight {
			wg.Go(func() {
				for r.runCtx.Err() == nil {
					t0 := time.Now()
					end, err := r.send(z, z.next.Add(1)-1)
					r.record(t0, end, err)
				}
			})
		}
	}
	wg.Wait()
}

// openLoop makes requests due at cfg.Rate in total, round-robin over the
// ztunnels, each served by its InFlight workers.
func (r *runner) openLoop() {
	var wg sync.WaitGroup
	for _, z := range r.zts {
		for range r.cfg.InFlight {
			wg.Go(func() {
				for {
					select {
					case <-r.runCtx.Done():
						return
					case due := <-z.queue:
						sent := time.Now()
						end, err := r.send(z, z.next.Add(1)-1)
						if r.record(due, end, err) {
							r.lag.Record(sent.Sub(due))
						}
					}
				}
			})
		}
	}
	pace(r.runCtx, r.start, r.winTo, r.cfg.Rate, func(i uint64, due time.Time) {
		z := r.zts[i%uint64(len(r.zts))]
		select {
		case z.queue <- due:
		default:
			r.record(due, due, &classError{class: ErrClientBacklog, err: errors.New("queue full")})
		}
	})
	wg.Wait()
}

// pace calls emit for request i = 0, 1, ... at its due time start + i/rate
// until end or ctx ends. A late pacer catches up by emitting every overdue
// request at once; due times never drift.
func pace(ctx context.Context, start, end time.Time, rate float64, emit func(i uint64, due time.Time)) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for i := uint64(0); ; i++ {
		due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if !due.Before(end) {
			return
		}
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		emit(i, due)
	}
}

// storm has every ztunnel connect and ask for each of its identities once,
// at most InFlight at a time, retrying failures with backoff until the
// deadline.
func (r *runner) storm() {
	var wg sync.WaitGroup
	for _, z := range r.zts {
		wg.Go(func() {
			sem := make(chan struct{}, r.cfg.InFlight)
			var mine sync.WaitGroup
			var failed atomic.Bool
			for i := range z.ids {
				sem <- struct{}{}
				mine.Go(func() {
					defer func() { <-sem }()
					if !r.fetch(z, uint64(i), sem) {
						failed.Store(true)
					}
				})
			}
			mine.Wait()
			if !failed.Load() {
				z.doneAt = time.Since(r.start)
			}
		})
	}
	wg.Wait()
}

// fetch gets identity i of z, retrying as Config.Retry says, and reports
// whether it got it. Like ztunnel, it gives its slot up while it waits to
// retry: the identity is asked for again when its backoff has passed.
func (r *runner) fetch(z *ztunnel, i uint64, sem chan struct{}) bool {
	backoff := backoffInitial
	for attempt := uint64(0); ; attempt++ {
		t0 := time.Now()
		end, err := r.send(z, i+attempt*uint64(len(z.ids)))
		r.record(t0, end, err)
		if err == nil {
			return true
		}
		if r.runCtx.Err() != nil {
			return false
		}
		if r.cfg.Retry == RetryAggressive {
			continue
		}
		<-sem
		select {
		case <-r.runCtx.Done():
			sem <- struct{}{}
			return false
		case <-time.After(jittered(backoff)):
		}
		sem <- struct{}{}
		backoff = min(2*backoff, backoffMax)
	}
}

// jittered is d give or take backoffJitter.
func jittered(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (1 + backoffJitter*(2*mrand.Float64()-1))) //nolint:gosec // retry jitter, not a secret
}

// hold keeps the connections open, idle, for Config.Hold.
func (r *runner) hold(ctx context.Context) {
	if r.cfg.Hold <= 0 {
		return
	}
	r.holdFrom = time.Now()
	select {
	case <-time.After(r.cfg.Hold):
	case <-ctx.Done():
	}
	r.holdTo = time.Now()
}

// progress prints a line every interval until the returned func is called.
func (r *runner) progress() (stop func()) {
	if r.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.cfg.ProgressInterval)
		defer t.Stop()
		last, lastAt := uint64(0), r.start
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				ok := r.allOK.Load()
				rate := float64(ok-last) / now.Sub(lastAt).Seconds()
				phase := "measuring"
				switch {
				case r.cfg.Once:
					phase = "storm"
				case lastAt.Before(r.winFrom): // this interval began in the warm-up
					phase = "warm-up"
				}
				fmt.Fprintf(r.cfg.Progress, "loadtest: %5.1fs %-9s certs/s %7.0f  errors %d  p99 so far %.2fms\n",
					now.Sub(r.start).Seconds(), phase, rate, r.allErrs.Load(), ms(r.lat.Quantile(0.99)))
				last, lastAt = ok, now
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func (r *runner) summary(setup time.Duration) *Summary {
	s := &Summary{
		Mode: "max", Ztunnels: len(r.zts), Identities: r.cfg.Plan.Identities(), InFlight: r.cfg.InFlight,
		SetupSeconds: setup.Seconds(), WarmupSeconds: r.cfg.Warmup.Seconds(),
		WindowStart: r.winFrom, WindowEnd: r.winTo, WindowSeconds: r.cfg.Duration.Seconds(),
		Certs: r.certs.Load(), ErrorsByCode: map[string]uint64{}, LatencyMS: latencyOf(&r.lat),
	}
	if r.cfg.Rate > 0 {
		s.Mode, s.TargetRate = "rate", r.cfg.Rate
		lag := latencyOf(&r.lag)
		s.StartLagMS = &lag
	}
	for c := range r.codes {
		if n := r.codes[c].Load(); n > 0 {
			s.ErrorsByCode[codes.Code(c).String()] = n
		}
	}
	r.other.Range(func(k, v any) bool {
		s.ErrorsByCode[k.(string)] += v.(*atomic.Uint64).Load()
		return true
	})
	for _, n := range s.ErrorsByCode {
		s.Errors += n
	}
	r.samples.Range(func(k, v any) bool {
		if s.ErrorSamples == nil {
			s.ErrorSamples = map[string]string{}
		}
		s.ErrorSamples[k.(string)] = v.(string)
		return true
	})
	if r.cfg.Once {
		s.Mode = "once"
		var done Histogram
		all := time.Duration(0)
		for _, z := range r.zts {
			if z.doneAt > 0 {
				s.ZtunnelsDone++
				done.Record(z.doneAt)
				all = max(all, z.doneAt)
			}
		}
		s.ZtunnelDoneP50Secs = done.Quantile(0.5).Seconds()
		if s.ZtunnelsDone == len(r.zts) {
			s.AllDoneSeconds = all.Seconds()
		}
		// The window is the storm itself.
		s.WindowEnd = r.start.Add(r.stormTook)
		s.WindowSeconds = r.stormTook.Seconds()
		s.Retry = r.cfg.Retry
		secs := min(len(r.okPerSec), int(r.stormTook/time.Second)+1)
		for i := range secs {
			s.CertsPerSecond = append(s.CertsPerSecond, r.okPerSec[i].Load())
			s.ErrorsPerSecond = append(s.ErrorsPerSecond, r.errPerSec[i].Load())
		}
		s.HoldStart, s.HoldEnd = r.holdFrom, r.holdTo
	}
	if s.WindowSeconds > 0 {
		s.CertsPerSec = float64(s.Certs) / s.WindowSeconds
	}
	return s
}
