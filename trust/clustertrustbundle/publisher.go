package clustertrustbundle

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/internal/rbac"
	"github.com/workload-ca/workload-ca/trust"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

// Config configures a Publisher. Client, TrustDomain and Roots are
// required; zero values of the other fields take the defaults.
type Config struct {
	Client kubernetes.Interface
	// SignerName links our bundles to a signer. Default DefaultSignerName.
	SignerName string
	// IstioCompatible also publishes IstioBundleName (signer
	// IstioSignerName), which Istio's charts mount by name.
	IstioCompatible bool
	// PeerTrustDomain, when set, publishes the roots of that federated
	// trust domain (Options.Roots returns them) for our workloads: the
	// bundles are labelled with it as LabelTrustDomain and
	// LabelSPIFFEPeerTD, so a pod selects them apart from our own.
	PeerTrustDomain spiffeid.TrustDomain
	// Preview, if set, returns the roots (of Options.Roots) in their
	// preview stage, and has a preview bundle of SignerName published
	// beside the live one: the live bundle (k8s.spiffe.io/canarying:
	// live) holds the roots but those, the preview bundle (preview) all
	// of them. The IstioCompatible bundle holds the live roots. Trigger
	// when a root goes live. Nil: only live bundles, of every root.
	Preview func() []*x509.Certificate
	// LeftOut, if set, is told when PeerTrustDomain's roots fail the
	// checks (a root not a CA certificate, or over 1 MiB): they are not
	// published, its bundles stay as they were, and the reason is logged
	// once; it is told nil when they pass again. It must be fast.
	LeftOut func([]rootset.LeftOut)
	// Options are what every publisher has; TrustDomain is ours.
	trust.Options
}

// kind is how the bundles are named in logs: reconciled per signer.
var kind = trust.Kind{Name: "ClusterTrustBundle", Key: "signer"}

// Publisher keeps the CA's roots published as ClusterTrustBundles.
type Publisher struct {
	client  kubernetes.Interface
	labels  map[string]string
	targets map[string]target // by signer name, which is the queue key
	preview func() []*x509.Certificate
	opts    trust.Options
	shell   *trust.Publisher
	leftOut *trust.LeftOutReport
}

// New checks cfg and returns a Publisher; Run starts it.
func New(cfg Config) (*Publisher, error) {
	opts, err := cfg.WithDefaults()
	if err == nil {
		err = cfg.check()
	}
	if err != nil {
		return nil, fmt.Errorf("clustertrustbundle: %w", err)
	}
	p := &Publisher{
		client:  cfg.Client,
		labels:  ownLabels(opts.TrustDomain, cmp.Or(cfg.PeerTrustDomain, opts.TrustDomain)),
		targets: map[string]target{cfg.SignerName: {signer: cfg.SignerName, preview: cfg.Preview != nil, peer: cfg.PeerTrustDomain}},
		preview: cfg.Preview,
		opts:    opts,
		shell:   trust.NewPublisher(kind, opts),
		leftOut: trust.NewLeftOutReport("its ClusterTrustBundle", cfg.LeftOut, opts.Logger),
	}
	if cfg.IstioCompatible {
		p.targets[IstioSignerName] = target{signer: IstioSignerName, fixedName: IstioBundleName}
	}
	return p, nil
}

// check checks what is particular to bundles, defaulting the signer name.
func (c *Config) check() error {
	if c.Client == nil {
		return errors.New("missing Client")
	}
	if c.SignerName == "" {
		c.SignerName = DefaultSignerName
	}
	if c.Preview != nil && !c.PeerTrustDomain.IsZero() {
		return errors.New("a peer trust domain's roots have no preview stage")
	}
	if c.IstioCompatible && !c.PeerTrustDomain.IsZero() {
		return errors.New("IstioCompatible publishes our own roots, not a peer trust domain's")
	}
	if c.SignerName == IstioSignerName {
		return fmt.Errorf("SignerName %s is reserved: set IstioCompatible instead", IstioSignerName)
	}
	return validateSignerName(c.SignerName)
}

// Run publishes the roots until ctx ends, then returns nil. It first picks
// the API version (discovery) and checks permissions; it returns an error
// wrapping ErrNotServed or rbac.ErrPermissionDenied, or a discovery or
// review error, without retrying. After that, failed reconciles are
// logged, reported to the Observer and retried with backoff. Only the
// leader should run it; Run may be called again after it returns.
func (p *Publisher) Run(ctx context.Context) error {
	return p.shell.Run(ctx, func(ctx context.Context) (trust.Target, error) {
		api, err := detectAPI(ctx, p.client)
		if err != nil {
			return nil, err
		}
		if err := rbac.Check(ctx, p.client, permissions(p.signers())...); err != nil {
			return nil, fmt.Errorf("clustertrustbundle: %w", err)
		}
		p.opts.Logger.InfoContext(ctx, "publishing roots as ClusterTrustBundles",
			"apiVersion", api.version, "signers", p.signers())
		return newRun(p, api), nil
	})
}

// Trigger asks for a reconcile of every bundle, e.g. after the roots
// changed. It does not block, and does nothing unless Run is running (Run
// reconciles everything when it starts).
func (p *Publisher) Trigger() { p.shell.Trigger() }

func (p *Publisher) signers() []string {
	out := make([]string, 0, len(p.targets))
	for s := range p.targets {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}
