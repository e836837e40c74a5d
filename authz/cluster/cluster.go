// Package cluster is the authentication and authorization of one
// Kubernetes cluster's callers: its tokens checked by its issuer's keys
// and its API server's TokenReviews, its pods and service accounts
// indexed from its API server, and the node-scoped policy over those pods.
// The CA has one for its own cluster, and one per remote cluster (Remotes)
// whose ztunnels it serves: nothing of one cluster decides for another.
// A remote cluster's kubeconfig from a Secret is checked (CheckKubeconfig)
// before any client is built from it: no command, file or proxy.
//
// Its Options are serve's flags of the clusters (the local cluster's id,
// the remote clusters, the node agents): they are validated and build the
// local cluster's checks and the remote ones (Options.Build), with the
// token checks' flags (tokenreview.Options) and the clients the process
// hands over.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/authz/podindex"
	"github.com/workload-ca/workload-ca/authz/saindex"
	"github.com/workload-ca/workload-ca/authz/tokenreview"
	"github.com/workload-ca/workload-ca/internal/component"
)

// Clients are a cluster's API clients, one per kind of work so that each
// has its own rate limit.
type Clients struct {
	// Reviews makes the TokenReviews and fetches the issuer's keys; its own
	// rate limit should be off (Config.ReviewRate paces the reviews).
	Reviews kubernetes.Interface
	// Pods and Accounts watch the pods and the service accounts.
	Pods, Accounts kubernetes.Interface
}

// Config configures a cluster's checks.
type Config struct {
	// ID is the cluster's id, as its callers send it in the clusterid
	// header; it names the cluster in logs and metrics.
	ID          string
	Clients     Clients
	TrustDomain spiffeid.TrustDomain
	NodeAgents  []authz.NodeAgent
	// Audiences, CacheTTL, ReviewRate and ReviewBurst are the token
	// checks' (tokenreview.Config).
	Audiences   []string
	CacheTTL    time.Duration
	ReviewRate  float64
	ReviewBurst int
	// Local decides pod-bound tokens of the cluster's issuer without a
	// TokenReview.
	Local bool
	// KeysRefresh is how often the issuer's keys are fetched again.
	KeysRefresh time.Duration
	Observer    tokenreview.Observer
	Logger      *slog.Logger
}

// Cluster checks the callers of one cluster.
type Cluster struct {
	id       string
	pods     *podindex.Index
	accounts *saindex.Index
	keys     *tokenreview.IssuerKeys
	reviewer *tokenreview.Reviewer
	policy   *authz.Policy
	log      *slog.Logger
}

// New wires a cluster's checks; nothing reaches its API server until they
// run.
func New(cfg Config) (*Cluster, error) {
	if cfg.Clients.Reviews == nil || cfg.Clients.Pods == nil || cfg.Clients.Accounts == nil {
		return nil, errors.New("cluster: the clients are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger
	if cfg.ID != "" {
		log = log.With("cluster", cfg.ID)
	}
	c := &Cluster{id: cfg.ID, log: log}
	c.pods = podindex.New(podindex.Config{Client: cfg.Clients.Pods, Logger: log.With("component", "podindex")})
	keysCfg := tokenreview.IssuerKeysConfig{Fetch: noKeys, MaxAge: cfg.KeysRefresh, Logger: log.With("component", "tokenreview")}
	// A client without a REST client (a fake) has no keys to fetch: every
	// token then goes to a TokenReview.
	if rest := cfg.Clients.Reviews.Discovery().RESTClient(); rest != nil {
		keysCfg.Fetch = tokenreview.JWKSFetcher(rest)
		if cfg.Local {
			keysCfg.FetchConfiguration = tokenreview.DiscoveryFetcher(rest)
		}
	}
	var err error
	if c.keys, err = tokenreview.NewIssuerKeys(keysCfg); err != nil {
		return nil, err
	}
	// Every replica knows each service account's UID, so that a cached
	// answer stops when its account is deleted or created again.
	if c.accounts, err = saindex.New(saindex.Config{Client: cfg.Clients.Accounts, Logger: log.With("component", "saindex")}); err != nil {
		return nil, err
	}
	c.reviewer, err = tokenreview.New(tokenreview.Config{
		Client: cfg.Clients.Reviews.AuthenticationV1(), Audiences: cfg.Audiences, MaxCacheTTL: cfg.CacheTTL,
		ReviewRate: cfg.ReviewRate, ReviewBurst: cfg.ReviewBurst,
		Pods: c.pods, Keys: c.keys, Accounts: c.accounts, Local: cfg.Local, Observer: cfg.Observer,
		Logger: log.With("component", "tokenreview"),
	})
	if err != nil {
		return nil, err
	}
	if c.policy, err = authz.NewPolicy(authz.PolicyConfig{TrustDomain: cfg.TrustDomain, NodeAgents: cfg.NodeAgents, Pods: c.pods}); err != nil {
		return nil, err
	}
	return c, nil
}

func noKeys(context.Context) ([]byte, error) {
	return nil, errors.New("cluster: the client cannot fetch the issuer's keys")
}

// ID is the cluster's id.
func (c *Cluster) ID() string { return c.id }

// Pods is the cluster's pod index.
func (c *Cluster) Pods() *podindex.Index { return c.pods }

// Accounts is the cluster's service account index.
func (c *Cluster) Accounts() *saindex.Index { return c.accounts }

// Reviewer is the cluster's token checks.
func (c *Cluster) Reviewer() *tokenreview.Reviewer { return c.reviewer }

// Prefetch fetches the issuer's keys once, so that the first requests need
// not wait for them; a failure is logged, and retried on use.
func (c *Cluster) Prefetch(ctx context.Context) { c.keys.Prefetch(ctx) }

// Issuer is the issuer of the cluster's tokens, once its keys are fetched.
func (c *Cluster) Issuer() string { return c.keys.Issuer() }

// Components are what keeps the cluster's indexes and keys current, with
// the readiness of the indexes.
func (c *Cluster) Components() []component.Component {
	return []component.Component{
		{Name: "pod-index", Run: c.pods.Run, Ready: component.Synced(c.pods.HasSynced)},
		{Name: "service-accounts", Run: c.accounts.Run, Ready: component.Synced(c.accounts.HasSynced)},
		{Name: "issuer-keys", Run: c.keys.Run},
	}
}

// Run runs the components until ctx ends or one fails.
func (c *Cluster) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, comp := range c.Components() {
		g.Go(func() error { return comp.Run(ctx) })
	}
	return g.Wait()
}

// Ready is nil once the indexes have synced: before, the cluster's
// callers are refused as unavailable (never decided on a partial index).
func (c *Cluster) Ready() error {
	if !c.pods.HasSynced() || !c.accounts.HasSynced() {
		return fmt.Errorf("%w: the pods and service accounts of cluster %q are not indexed yet", authz.ErrUnavailable, c.id)
	}
	return nil
}

// Authenticate checks a bearer token with this cluster's issuer and API
// server.
func (c *Cluster) Authenticate(ctx context.Context, token string) (authz.Caller, error) {
	return c.reviewer.Authenticate(ctx, token)
}

// Authorize decides a caller's identity from this cluster's pods.
func (c *Cluster) Authorize(ctx context.Context, caller authz.Caller, requested spiffeid.ID) (spiffeid.ID, error) {
	return c.policy.Authorize(ctx, caller, requested)
}
