package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/authz/tokenreview"
	"github.com/workload-ca/workload-ca/internal/cliflag"
	"github.com/workload-ca/workload-ca/internal/component"
)

// Options are the flags of the clusters whose callers the CA serves: the
// local cluster's id, the remote clusters, and the node agents of each.
type Options struct {
	ID string
	// RemoteSecrets watches the Secrets labelled istio/multiCluster=true
	// in RemoteSecretsNS for remote clusters; RemoteKubeconfigs are more,
	// by cluster id.
	RemoteSecrets     bool
	RemoteSecretsNS   string
	RemoteKubeconfigs map[string]string
	remoteKubeconfigs cliflag.List
	NodeAgents        []authz.NodeAgent
	agents            cliflag.List
}

// AddFlags defines --cluster-id in the section Authentication, and the
// sections Multi-cluster and Authorization.
func (o *Options) AddFlags(fs *cliflag.FlagSet) {
	o.agents = cliflag.List{"istio-system/ztunnel"}
	fs.Section("Authentication")
	fs.StringVar(&o.ID, "cluster-id", "", "if set, refuse requests whose clusterid header names another cluster (Unauthenticated), as istiod does; Istio's default cluster id is Kubernetes")
	fs.Section("Multi-cluster (with --cluster-id)")
	fs.BoolVar(&o.RemoteSecrets, "remote-cluster-secrets", false, "serve the ztunnels of remote clusters configured by the Secrets labelled istio/multiCluster=true in --remote-cluster-secrets-namespace (istiod's remote secrets: each data key a cluster id, each value its kubeconfig), added, changed and removed without a restart; a request picks its cluster with its clusterid header")
	fs.StringVar(&o.RemoteSecretsNS, "remote-cluster-secrets-namespace", "", "namespace of the remote cluster Secrets (default: --leader-election-namespace, the CA's own)")
	fs.Var(&o.remoteKubeconfigs, "remote-kubeconfigs", "comma-separated cluster-id=kubeconfig-file of remote clusters to serve besides those of --remote-cluster-secrets, read at start")
	fs.Section("Authorization")
	fs.Var(&o.agents, "node-agents", "comma-separated namespace/serviceaccount of node agents that may request identities of pods on their node")
	fs.Example("cluster-id", "Kubernetes")
	fs.Example("remote-kubeconfigs", "east=/etc/remote/east.kubeconfig")
	fs.Example("remote-cluster-secrets-namespace", "istio-system")
}

// Validate checks the flags, every problem reported; the remote cluster
// Secrets are looked for in namespace unless
// --remote-cluster-secrets-namespace names another.
func (o *Options) Validate(namespace string) error {
	var errs []error
	for _, a := range o.agents {
		na, err := authz.ParseNodeAgent(a)
		if err != nil {
			errs = append(errs, fmt.Errorf("--node-agents: %w", err))
		}
		o.NodeAgents = append(o.NodeAgents, na)
	}
	return errors.Join(append(errs, o.validateRemotes(namespace)...)...)
}

// validateRemotes checks the remote clusters: they need --cluster-id (a
// request names its cluster, and the local one must have a name), and
// each --remote-kubeconfigs entry is id=file, with an id of its own.
func (o *Options) validateRemotes(namespace string) []error {
	if !o.RemoteSecrets && len(o.remoteKubeconfigs) == 0 {
		return nil
	}
	var errs []error
	if o.ID == "" {
		errs = append(errs, errors.New("--remote-cluster-secrets and --remote-kubeconfigs need --cluster-id, the id of this CA's own cluster (e.g. --cluster-id=Kubernetes)"))
	}
	if o.RemoteSecretsNS == "" {
		o.RemoteSecretsNS = namespace
	}
	o.RemoteKubeconfigs = map[string]string{}
	for _, e := range o.remoteKubeconfigs {
		id, path, ok := strings.Cut(e, "=")
		switch {
		case !ok || id == "" || path == "":
			errs = append(errs, fmt.Errorf("--remote-kubeconfigs %q: want cluster-id=kubeconfig-file", e))
		case id == o.ID:
			errs = append(errs, fmt.Errorf("--remote-kubeconfigs %q: %q is this CA's own --cluster-id", e, id))
		case o.RemoteKubeconfigs[id] != "":
			errs = append(errs, fmt.Errorf("--remote-kubeconfigs: cluster %q given twice", id))
		default:
			o.RemoteKubeconfigs[id] = path
		}
	}
	return errs
}

// hasRemotes reports whether remote clusters are configured.
func (o *Options) hasRemotes() bool { return o.RemoteSecrets || len(o.RemoteKubeconfigs) > 0 }

// Wiring is what the clusters take from the rest of the CA: the API
// clients of each, the token checks' flags, and where they report.
type Wiring struct {
	// Local are the local cluster's clients; ClientsFor makes remote
	// cluster id's from its configuration.
	Local      Clients
	ClientsFor func(id string, cfg *rest.Config) (Clients, error)
	// Secrets watches the remote cluster Secrets.
	Secrets     kubernetes.Interface
	Tokens      tokenreview.Options
	TrustDomain spiffeid.TrustDomain
	// ReviewRate and ReviewBurst pace each cluster's TokenReviews.
	ReviewRate  float64
	ReviewBurst int
	Observer    interface {
		tokenreview.Observer
		Observer
	}
	Logger *slog.Logger
}

// Set is the clusters the Options describe: the local one, the remote
// ones (nil: none configured), and what they run on every replica.
type Set struct {
	Local      *Cluster
	Remotes    *Remotes
	Components []component.Component
}

// Build makes the local cluster's checks and fetches its issuer's keys
// once (a failure is logged, and retried on use), then the remote
// clusters'.
func (o *Options) Build(ctx context.Context, w Wiring) (*Set, error) {
	local, err := New(o.config(o.ID, w.Local, w))
	if err != nil {
		return nil, err
	}
	local.Prefetch(ctx)
	if w.Tokens.Local && local.Issuer() != "" {
		w.Logger.Info("tokens are verified locally", "issuer", local.Issuer())
	}
	s := &Set{Local: local, Components: local.Components()}
	if !o.hasRemotes() {
		return s, nil
	}
	return s, o.buildRemotes(s, w)
}

// config is the configuration of the checks of cluster id: the same
// flags for every cluster, each with its own clients, rate limits, caches
// and indexes.
func (o *Options) config(id string, clients Clients, w Wiring) Config {
	return Config{ID: id, Clients: clients, TrustDomain: w.TrustDomain, NodeAgents: o.NodeAgents,
		Audiences: w.Tokens.Audiences, CacheTTL: w.Tokens.CacheTTL, ReviewRate: w.ReviewRate, ReviewBurst: w.ReviewBurst,
		Local: w.Tokens.Local, KeysRefresh: w.Tokens.KeysRefresh, Observer: w.Observer, Logger: w.Logger}
}

// buildRemotes wires the remote clusters of --remote-kubeconfigs and
// --remote-cluster-secrets: every replica runs each one's checks.
func (o *Options) buildRemotes(s *Set, w Wiring) error {
	log := w.Logger.With("component", "remote-clusters")
	build := func(id string, cfg *rest.Config) (*Cluster, error) {
		clients, err := w.ClientsFor(id, cfg)
		if err != nil {
			return nil, err
		}
		return New(o.config(id, clients, w))
	}
	r, err := NewRemotes(RemotesConfig{Local: o.ID, Build: build, Observer: w.Observer, Logger: log})
	if err != nil {
		return err
	}
	files := map[string][]byte{}
	for id, path := range o.RemoteKubeconfigs {
		if files[id], err = os.ReadFile(path); err != nil { //nolint:gosec // the operator's kubeconfig files
			return fmt.Errorf("--remote-kubeconfigs: cluster %s: %w", id, err)
		}
	}
	r.Set("--remote-kubeconfigs", Trusted, files)
	s.Remotes = r
	s.Components = append(s.Components, component.Component{Name: "remote-clusters", Run: r.Run})
	if o.RemoteSecrets {
		s.Components = append(s.Components, component.Component{Name: "remote-cluster-secrets", Run: func(ctx context.Context) error {
			return WatchSecrets(ctx, w.Secrets, o.RemoteSecretsNS, r, log)
		}})
	}
	return nil
}
