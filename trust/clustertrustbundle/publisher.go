package clustertrustbundle

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/internal/contest"
	"github.com/workload-ca/workload-ca/internal/keyloop"
	"github.com/workload-ca/workload-ca/internal/rbac"
)

// DefaultResyncPeriod is how often Run reconciles without a trigger.
const DefaultResyncPeriod = 10 * time.Minute

// Config configures a Publisher. Client, TrustDomain and Roots are
// required; zero values of the other fields take the defaults.
type Config struct {
	Client kubernetes.Interface
	// TrustDomain is the value of the LabelTrustDomain label.
	TrustDomain spiffeid.TrustDomain
	// SignerName links our bundles to a signer. Default DefaultSignerName.
	SignerName string
	// IstioCompatible also publishes IstioBundleName (signer
	// IstioSignerName), which Istio's charts mount by name.
	IstioCompatible bool
	// Roots returns the current roots. It is called on every reconcile,
	// must be safe for concurrent use, and must not block.
	Roots func() []*x509.Certificate
	// Observer, if set, is told the outcome of every reconcile.
	Observer Observer
	Logger   *slog.Logger
	// Clock drives the periodic resync and the workqueue's retry delays.
	Clock clock.WithTicker
	// ResyncPeriod is how often every bundle is reconciled without a
	// trigger. Default DefaultResyncPeriod.
	ResyncPeriod time.Duration
	// RepairInterval is the least time between two repairs of one bundle
	// after someone else changed its content. Default
	// contest.DefaultInterval.
	RepairInterval time.Duration
}

// Publisher keeps the CA's roots published as ClusterTrustBundles.
type Publisher struct {
	client  kubernetes.Interface
	roots   func() []*x509.Certificate
	labels  map[string]string
	targets map[string]target // by signer name, which is the queue key
	obs     Observer
	log     *slog.Logger
	clock   clock.WithTicker
	resync  time.Duration
	repair  time.Duration

	running atomic.Bool
	active  keyloop.Current
}

// New checks cfg and returns a Publisher; Run starts it.
func New(cfg Config) (*Publisher, error) {
	if err := cfg.applyDefaults(); err != nil {
		return nil, fmt.Errorf("clustertrustbundle: %w", err)
	}
	p := &Publisher{
		client:  cfg.Client,
		roots:   cfg.Roots,
		labels:  ownLabels(cfg.TrustDomain),
		targets: map[string]target{cfg.SignerName: {signer: cfg.SignerName}},
		obs:     cfg.Observer,
		log:     cfg.Logger,
		clock:   cfg.Clock,
		resync:  cfg.ResyncPeriod,
		repair:  cfg.RepairInterval,
	}
	if cfg.IstioCompatible {
		p.targets[IstioSignerName] = target{signer: IstioSignerName, fixedName: IstioBundleName}
	}
	return p, nil
}

func (c *Config) applyDefaults() error {
	switch {
	case c.Client == nil:
		return errors.New("missing Client")
	case c.Roots == nil:
		return errors.New("missing Roots")
	case c.TrustDomain.IsZero():
		return errors.New("missing TrustDomain")
	case c.ResyncPeriod < 0 || c.RepairInterval < 0:
		return fmt.Errorf("ResyncPeriod %v or RepairInterval %v is negative", c.ResyncPeriod, c.RepairInterval)
	}
	if errs := validation.IsValidLabelValue(c.TrustDomain.Name()); len(errs) > 0 {
		return fmt.Errorf("trust domain %q cannot be a label value: %v", c.TrustDomain.Name(), errs)
	}
	if c.SignerName == "" {
		c.SignerName = DefaultSignerName
	}
	if c.SignerName == IstioSignerName {
		return fmt.Errorf("SignerName %s is reserved: set IstioCompatible instead", IstioSignerName)
	}
	if err := validateSignerName(c.SignerName); err != nil {
		return err
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.ResyncPeriod == 0 {
		c.ResyncPeriod = DefaultResyncPeriod
	}
	if c.RepairInterval == 0 {
		c.RepairInterval = contest.DefaultInterval
	}
	return nil
}

// Run publishes the roots until ctx ends, then returns nil. It first picks
// the API version (discovery) and checks permissions; it returns an error
// wrapping ErrNotServed or rbac.ErrPermissionDenied, or a discovery or review
// error, without retrying. After that, failed reconciles are logged,
// reported to the Observer and retried with backoff. Only the leader
// should run it; Run may be called again after it returns.
func (p *Publisher) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("clustertrustbundle: Run is already running")
	}
	defer p.running.Store(false)
	api, err := detectAPI(ctx, p.client)
	if err != nil {
		return err
	}
	if err := rbac.Check(ctx, p.client, permissions(p.signers())...); err != nil {
		return fmt.Errorf("clustertrustbundle: %w", err)
	}
	p.log.InfoContext(ctx, "publishing roots as ClusterTrustBundles",
		"apiVersion", api.version, "signers", p.signers())
	p.active.Run(ctx, newRun(p, api).loop())
	return nil
}

// Trigger asks for a reconcile of every bundle, e.g. after the roots
// changed. It does not block, and does nothing unless Run is running (Run
// reconciles everything when it starts).
func (p *Publisher) Trigger() { p.active.EnqueueAll() }

func (p *Publisher) signers() []string {
	out := make([]string, 0, len(p.targets))
	for s := range p.targets {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}
