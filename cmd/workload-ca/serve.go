package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/authz/podindex"
	"github.com/workload-ca/workload-ca/authz/tokenreview"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/server"
)

// serveConfig is the validated configuration of `workload-ca serve`.
type serveConfig struct {
	ListenAddr      string
	TrustDomain     spiffeid.TrustDomain
	CADir           string
	CAKeyType       string
	DefaultTTL      time.Duration
	MaxTTL          time.Duration
	ServingDNSNames []string
	ServingTTL      time.Duration
	TLSMinVersion   uint16
	Kubeconfig      string
	KubeQPS         float64
	KubeBurst       int
	TokenAudiences  []string
	TokenCacheTTL   time.Duration
	NodeAgents      []authz.NodeAgent
	GracePeriod     time.Duration
	LogLevel        slog.Level
}

// parseServeFlags builds the configuration from flags (environment
// variables WORKLOAD_CA_<FLAG> as fallback) and validates it once.
func parseServeFlags(args []string, stderr io.Writer) (serveConfig, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c serveConfig
	var td, tlsMin, logLevel string
	dnsNames := listFlag{"localhost"}
	audiences := listFlag{tokenreview.DefaultAudience}
	agents := listFlag{"istio-system/ztunnel"}
	fs.StringVar(&c.ListenAddr, "listen-addr", ":15012", "gRPC listen address")
	fs.StringVar(&td, "trust-domain", "cluster.local", "SPIFFE trust domain of issued identities")
	fs.StringVar(&c.CADir, "ca-dir", "", "directory of CA material (Istio cacerts or tls.crt/tls.key/ca.crt layout); a self-signed root is generated there when empty (required)")
	fs.StringVar(&c.CAKeyType, "ca-key-type", "ecdsa-p256", "key type of a generated root: ecdsa-p256, ecdsa-p384, rsa-2048, rsa-3072, rsa-4096")
	fs.DurationVar(&c.DefaultTTL, "default-ttl", 24*time.Hour, "lifetime of a certificate when the request names none")
	fs.DurationVar(&c.MaxTTL, "max-ttl", 90*24*time.Hour, "longest certificate lifetime; longer requests are clamped")
	fs.Var(&dnsNames, "serving-dns-names", "comma-separated DNS names of the serving certificate (the names clients dial)")
	fs.DurationVar(&c.ServingTTL, "serving-ttl", 24*time.Hour, "lifetime of the serving certificate; renewed after two thirds")
	fs.StringVar(&tlsMin, "tls-min-version", "1.3", "minimum TLS version: 1.3 or 1.2")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file; in-cluster configuration when empty")
	fs.Float64Var(&c.KubeQPS, "kube-api-qps", 50, "sustained rate of Kubernetes API requests (TokenReviews, pod lookups)")
	fs.IntVar(&c.KubeBurst, "kube-api-burst", 100, "burst of Kubernetes API requests")
	fs.Var(&audiences, "token-audiences", "comma-separated audiences a bearer token must carry")
	fs.DurationVar(&c.TokenCacheTTL, "token-cache-ttl", tokenreview.DefaultMaxCacheTTL, "upper bound on caching a token review (the token's expiry bounds it too)")
	fs.Var(&agents, "node-agents", "comma-separated namespace/serviceaccount of node agents that may request identities of pods on their node")
	fs.DurationVar(&c.GracePeriod, "grace-period", 15*time.Second, "how long in-flight requests may take at shutdown")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if err := envFallback(fs); err != nil {
		return c, err
	}
	c.ServingDNSNames, c.TokenAudiences = dnsNames, audiences
	return c, c.finish(td, tlsMin, logLevel, agents)
}

// finish parses the remaining string flags and validates the whole.
func (c *serveConfig) finish(td, tlsMin, logLevel string, agents []string) error {
	var errs []error
	var err error
	if c.TrustDomain, err = spiffeid.TrustDomainFromString(td); err != nil {
		errs = append(errs, fmt.Errorf("--trust-domain: %w", err))
	}
	switch tlsMin {
	case "1.3":
		c.TLSMinVersion = tls.VersionTLS13
	case "1.2":
		c.TLSMinVersion = tls.VersionTLS12
	default:
		errs = append(errs, fmt.Errorf("--tls-min-version %q: want 1.3 or 1.2", tlsMin))
	}
	if err := c.LogLevel.UnmarshalText([]byte(logLevel)); err != nil {
		errs = append(errs, fmt.Errorf("--log-level: %w", err))
	}
	for _, a := range agents {
		na, err := authz.ParseNodeAgent(a)
		if err != nil {
			errs = append(errs, fmt.Errorf("--node-agents: %w", err))
		}
		c.NodeAgents = append(c.NodeAgents, na)
	}
	if c.CADir == "" {
		errs = append(errs, errors.New("--ca-dir is required"))
	}
	if c.DefaultTTL <= 0 || c.MaxTTL < c.DefaultTTL {
		errs = append(errs, fmt.Errorf("--default-ttl %v must be positive and at most --max-ttl %v", c.DefaultTTL, c.MaxTTL))
	}
	if len(c.ServingDNSNames) == 0 || c.ServingTTL <= 0 {
		errs = append(errs, errors.New("--serving-dns-names and a positive --serving-ttl are required"))
	}
	if c.KubeQPS <= 0 || c.KubeBurst <= 0 {
		errs = append(errs, errors.New("--kube-api-qps and --kube-api-burst must be positive"))
	}
	if len(c.TokenAudiences) == 0 {
		errs = append(errs, errors.New("--token-audiences must name at least one audience"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return nil
}

func runServe(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := parseServeFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	// client-go logs through klog; route it into our logger. Its verbosity
	// stays at the default, which never logs bearer tokens.
	klog.SetSlogLogger(log.With("component", "client-go"))
	return serve(ctx, cfg, log)
}

// serve wires the CA and runs it until ctx ends.
func serve(ctx context.Context, cfg serveConfig, log *slog.Logger) error {
	kube, err := kubeClient(cfg)
	if err != nil {
		return err
	}
	if err := tokenreview.CheckAccess(ctx, kube); err != nil {
		return err
	}
	authority, err := loadAuthority(cfg, log)
	if err != nil {
		return err
	}
	pods := podindex.New(podindex.Config{Client: kube, Logger: log.With("component", "podindex")})
	reviewer, err := tokenreview.New(tokenreview.Config{
		Client: kube.AuthenticationV1(), Audiences: cfg.TokenAudiences, MaxCacheTTL: cfg.TokenCacheTTL,
		Pods: pods, Logger: log.With("component", "tokenreview"),
	})
	if err != nil {
		return err
	}
	policy, err := authz.NewPolicy(authz.PolicyConfig{TrustDomain: cfg.TrustDomain, NodeAgents: cfg.NodeAgents, Pods: pods})
	if err != nil {
		return err
	}
	svc, err := server.NewService(server.Config{
		Authenticator: reviewer, Authorizer: policy, Signer: authority, Logger: log,
		Ready: func() error { return readyIf(pods.HasSynced(), "pod index not synced") },
	})
	if err != nil {
		return err
	}
	serving, err := server.NewServingCert(ctx, server.ServingCertConfig{Issuer: authority, DNSNames: cfg.ServingDNSNames, TTL: cfg.ServingTTL})
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return err
	}
	grpcServer := server.NewGRPCServer(svc, server.TLSConfig(serving.GetCertificate, cfg.TLSMinVersion))
	grpcServer.GracePeriod = cfg.GracePeriod
	log.Info("serving", "addr", lis.Addr().String(), "trust_domain", cfg.TrustDomain.String(), "version", version)

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return pods.Run(ctx) })
	g.Go(func() error { return grpcServer.Serve(ctx, lis) })
	err = g.Wait()
	log.Info("stopped", "error", err)
	return err
}

func readyIf(ok bool, reason string) error {
	if ok {
		return nil
	}
	return errors.New(reason)
}

// loadAuthority loads the CA material from --ca-dir, generating a
// self-signed root there on first start.
func loadAuthority(cfg serveConfig, log *slog.Logger) (*ca.Authority, error) {
	m, created, err := keystore.LoadOrCreate(cfg.CADir, keystore.GenerateOptions{KeyType: cfg.CAKeyType, TrustDomain: cfg.TrustDomain}, time.Now())
	if err != nil {
		return nil, err
	}
	if created {
		log.Info("generated a self-signed root", "dir", cfg.CADir, "key_type", cfg.CAKeyType)
	}
	a, err := ca.New(ca.Config{TrustDomain: cfg.TrustDomain, DefaultTTL: cfg.DefaultTTL, MaxTTL: cfg.MaxTTL}, m)
	if err != nil {
		return nil, err
	}
	sc := a.SigningCert()
	log.Info("CA loaded", "subject", sc.Subject.String(), "not_after", sc.NotAfter, "roots", len(a.Roots()))
	return a, nil
}

// kubeClient builds a client from a kubeconfig file, or in-cluster. Its
// rate limit is ours to set: client-go's default (5/s) would throttle
// TokenReviews during a cold-start storm.
func kubeClient(cfg serveConfig) (kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = cfg.Kubeconfig
	restCfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	restCfg.UserAgent = "workload-ca/" + version
	restCfg.QPS, restCfg.Burst = float32(cfg.KubeQPS), cfg.KubeBurst
	return kubernetes.NewForConfig(restCfg)
}
