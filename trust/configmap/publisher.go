package configmap

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/internal/rbac"
	"github.com/workload-ca/workload-ca/trust"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

// Config configures a Publisher. Client, TrustDomain and Roots are
// required; zero values of the other fields take the defaults.
type Config struct {
	Client kubernetes.Interface
	// NamespaceSelector picks the namespaces that get the ConfigMap, by
	// their labels. Nil selects every namespace.
	NamespaceSelector labels.Selector
	// Peers, if set, returns the roots held of the federated trust
	// domains whose roots join ours (Options.Roots) in the ConfigMap, in
	// order. Each peer is judged on its own roots: one that is not a CA
	// certificate, one whose name constraints do not keep it off
	// OurDNSDomains (rootset.KeepsOffDNS), or roots that would take the
	// content past ContentBudget leave that peer out, logged and reported
	// to LeftOut; our roots and the other peers' still go in.
	Peers func() []rootset.Peer
	// OurDNSDomains are DNS domains, besides DefaultDNSDomains, that a
	// peer's root must not be able to vouch for: istiod's names, the
	// cluster domain if it is not cluster.local.
	OurDNSDomains []string
	// LeftOut, if set, is told the peers left out each time that list
	// changes (nil: none left out any more). It must be fast.
	LeftOut func([]rootset.LeftOut)
	// Options are what every publisher has; TrustDomain is the value of
	// the LabelTrustDomain label.
	trust.Options
}

// kind is how the ConfigMaps are named in logs: one per namespace.
var kind = trust.Kind{Name: "ConfigMap", Key: "namespace"}

// Publisher keeps the CA's roots published as the ConfigMap ConfigMapName
// in every selected namespace.
type Publisher struct {
	client   kubernetes.Interface
	selector labels.Selector
	labels   map[string]string
	opts     trust.Options
	shell    *trust.Publisher
	peers    func() []rootset.Peer
	compose  rootset.Composition
	leftOut  *trust.LeftOutReport
}

// New checks cfg and returns a Publisher; Run starts it.
func New(cfg Config) (*Publisher, error) {
	opts, err := cfg.WithDefaults()
	if err == nil && cfg.Client == nil {
		err = errors.New("missing Client")
	}
	if err != nil {
		return nil, fmt.Errorf("configmap: %w", err)
	}
	if cfg.NamespaceSelector == nil {
		cfg.NamespaceSelector = labels.Everything()
	}
	domains := slices.Concat(DefaultDNSDomains, cfg.OurDNSDomains)
	return &Publisher{client: cfg.Client, selector: cfg.NamespaceSelector, labels: ownLabels(opts.TrustDomain),
		opts: opts, shell: trust.NewPublisher(kind, opts), peers: cfg.Peers,
		compose: rootset.Composition{Budget: ContentBudget, Check: func(c *x509.Certificate) error { return rootset.KeepsOffDNS(c, domains) }},
		leftOut: trust.NewLeftOutReport(ConfigMapName, cfg.LeftOut, opts.Logger)}, nil
}

// Run publishes the roots until ctx ends, then returns nil. It first
// checks permissions; it returns an error wrapping
// rbac.ErrPermissionDenied, or a review error, without retrying. After
// that, failed reconciles are logged, reported to the Observer and retried
// with backoff. Only the leader should run it; Run may be called again
// after it returns.
func (p *Publisher) Run(ctx context.Context) error {
	return p.shell.Run(ctx, func(ctx context.Context) (trust.Target, error) {
		if err := rbac.Check(ctx, p.client, permissions()...); err != nil {
			return nil, fmt.Errorf("configmap: %w", err)
		}
		p.opts.Logger.InfoContext(ctx, "publishing roots as ConfigMaps",
			"configMap", ConfigMapName, "namespaceSelector", p.selector.String())
		return newRun(p), nil
	})
}

// Trigger asks for a reconcile of every namespace, e.g. after the roots
// changed. It does not block, and does nothing unless Run is running (Run
// reconciles everything when it starts).
func (p *Publisher) Trigger() { p.shell.Trigger() }
