package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/workload-ca/workload-ca/authz/cluster"
	"github.com/workload-ca/workload-ca/authz/tokenreview"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/ca/source"
	"github.com/workload-ca/workload-ca/ca/upstream/upstreamconfig"
	"github.com/workload-ca/workload-ca/internal/component"
	"github.com/workload-ca/workload-ca/internal/leader"
	"github.com/workload-ca/workload-ca/issuance"
	"github.com/workload-ca/workload-ca/istiodcert"
	"github.com/workload-ca/workload-ca/metrics"
	"github.com/workload-ca/workload-ca/podcert"
	"github.com/workload-ca/workload-ca/server"
	"github.com/workload-ca/workload-ca/server/admin"
	"github.com/workload-ca/workload-ca/trust"
	"github.com/workload-ca/workload-ca/trust/clustertrustbundle"
	"github.com/workload-ca/workload-ca/trust/configmap"
	"github.com/workload-ca/workload-ca/trust/federation"
)

func runServe(ctx context.Context, cfg serveConfig, stdout, _ io.Writer) error {
	if cfg.Validate {
		return validateServe(ctx, cfg, stdout)
	}
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	var h slog.Handler = slog.NewJSONHandler(stdout, opts)
	if cfg.LogText {
		h = slog.NewTextHandler(stdout, opts)
	}
	log := slog.New(h)
	// client-go logs through klog; route it into our logger. Its verbosity
	// stays at the default, which never logs bearer tokens.
	klog.SetSlogLogger(log.With("component", "client-go"))
	audit, closeAudit, err := auditLogger(cfg.AuditLog, log)
	if err != nil {
		return err
	}
	defer closeAudit()
	return serve(ctx, cfg, log, audit)
}

// auditLogger writes audit records to their own file, or with the other
// logs (marked "log":"audit") when path is empty.
func auditLogger(path string, log *slog.Logger) (*slog.Logger, func(), error) {
	if path == "" {
		return log.With("log", "audit"), func() {}, nil
	}
	f, err := os.OpenFile(filepath.Clean(path), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("--audit-log: %w", err)
	}
	return slog.New(slog.NewJSONHandler(f, nil)).With("log", "audit"), func() { _ = f.Close() }, nil
}

// app is the wired CA: its components, each run on every replica or only
// on the leader, and what they share.
type app struct {
	cfg       serveConfig
	log       *slog.Logger
	audit     *slog.Logger
	reg       *prometheus.Registry
	metrics   *metrics.Metrics
	kube      *kubeClients
	source    *source.Source
	authority *ca.Authority
	// local checks the callers of this CA's own cluster; remotes, those
	// of remote clusters (nil: none configured).
	local     *cluster.Cluster
	remotes   *cluster.Remotes
	svc       *server.Service
	pipeline  *issuance.Pipeline
	serving   *server.ServingCert
	readiness *admin.Readiness
	grpc      *server.GRPCServer
	lis       net.Listener
	adminLis  net.Listener
	// caKey is the key of --ca-key-uri (nil: the key is a file).
	caKey *keystore.Key
	// importer holds the federated trust domains' bundles (nil: none),
	// and peerTriggers are the publishers to trigger when one changes.
	importer     *federation.Importer
	peerTriggers map[spiffeid.TrustDomain][]func()
	// leftOut counts the peers whose roots a destination leaves out.
	leftOut metrics.LeftOut
	// components are what runs besides the gRPC and admin servers.
	components []component.Component
}

// serve wires the CA and runs it until ctx ends.
func serve(ctx context.Context, cfg serveConfig, log, audit *slog.Logger) error {
	reg := prometheus.NewRegistry()
	a := &app{cfg: cfg, log: log, audit: audit, reg: reg,
		metrics: metrics.New(reg, metrics.Options{IstioCompat: cfg.IstioMetrics, Build: readBuild().metrics()})}
	if err := a.openCAKey(ctx); err != nil {
		return err
	}
	defer a.closeCAKey()
	var err error
	if a.kube, err = newKubeClients(cfg); err != nil {
		return err
	}
	if err := tokenreview.CheckAccess(ctx, a.kube.reviews); err != nil {
		return err
	}
	steps := []func(context.Context) error{a.loadCA, a.buildPipeline, a.federate, a.publishBundles, a.publishRootConfigMaps, a.keepIstiodCert, a.buildServer, a.signPodCertificates, a.buildAdmin}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return a.run(ctx)
}

// loadCA loads the CA's material from its Secret or its directory; the
// source's components keep it current.
func (a *app) loadCA(ctx context.Context) error {
	cfg := source.Config{
		Authority: ca.Config{TrustDomain: a.cfg.TrustDomain, DefaultTTL: a.cfg.DefaultTTL, MaxTTL: a.cfg.MaxTTL},
		Dir:       a.cfg.CADir, RootDir: a.cfg.CARootDir, Key: a.caKeySigner(), KeyType: a.cfg.CAKeyType,
		Poll: a.cfg.CADirPoll, Observer: a.metrics, Logger: a.log,
	}
	if a.cfg.CASecret.Name != "" {
		policy, err := a.cfg.rotationPolicy()
		if err != nil {
			return err
		}
		cfg.Secret, cfg.Client, cfg.Policy = a.cfg.CASecret, a.kube.caState, policy
	}
	if a.cfg.Upstream != nil {
		m, err := a.cfg.Upstream.Minter(a.upstreamWiring())
		if err != nil {
			return fmt.Errorf("--ca-upstream-config: %w", err)
		}
		cfg.Upstream, cfg.ReadyMargin = m.Generate, a.cfg.Upstream.ReadyMargin
	}
	src, err := source.Open(ctx, cfg)
	if err != nil {
		return err
	}
	a.source, a.authority = src, src.Authority()
	a.add(src.Components()...)
	return nil
}

// upstreamWiring is what the upstream's Minter takes from the process:
// before the source is open, the first intermediate is being made and
// there are no anchors, nor a successor to miss.
func (a *app) upstreamWiring() upstreamconfig.Wiring {
	obs := metrics.WatchUpstream(a.reg, time.Now, func() (time.Time, bool) {
		if a.source == nil {
			return time.Time{}, false
		}
		return a.source.SuccessorMissing()
	})
	current := func() []*x509.Certificate {
		if a.source == nil {
			return nil
		}
		return a.source.Anchors()
	}
	return upstreamconfig.Wiring{Client: a.kube.upstream, TrustDomain: a.cfg.TrustDomain, KeyType: a.cfg.CAKeyType,
		Lifetime: a.cfg.CATTL, Current: current, Observer: obs, Logger: a.log}
}

// buildPipeline makes the issuance pipeline both front doors hand their
// requests to.
func (a *app) buildPipeline(context.Context) error {
	var err error
	a.pipeline, err = issuance.New(issuance.Config{Signer: a.authority, Audit: a.audit, Logger: a.log, Observer: a.metrics})
	return err
}

// add adds components to run.
func (a *app) add(cs ...component.Component) { a.components = append(a.components, cs...) }

// signPodCertificates makes the leader sign the PodCertificateRequests
// addressed to --signer-name.
func (a *app) signPodCertificates(context.Context) error {
	if !a.cfg.PodCertificates {
		return nil
	}
	c, err := podcert.New(podcert.Config{Client: a.kube.podCerts, SignerName: a.cfg.SignerName, TrustDomain: a.cfg.TrustDomain,
		Signer: a.authority, Pipeline: a.pipeline, Observer: a.metrics, Logger: a.log.With("component", "podcert"),
		Workers: a.cfg.PodCertWorkers, Pods: a.local.Pods(), Accounts: a.local.Accounts()})
	if err != nil {
		return err
	}
	a.add(component.Component{Name: "podcert", Leader: true, Run: c.Run})
	return nil
}

// publishBundles makes the leader publish the roots as ClusterTrustBundles.
func (a *app) publishBundles(context.Context) error {
	if !a.cfg.PublishTrustBundle {
		return nil
	}
	var preview func() []*x509.Certificate // nil: no preview stage
	if a.cfg.Preview > 0 && a.cfg.CASecret.Name != "" {
		preview = a.source.Preview
	}
	p, err := clustertrustbundle.New(clustertrustbundle.Config{Client: a.kube.bundles, SignerName: a.cfg.SignerName,
		IstioCompatible: a.cfg.IstioCompatible, Preview: preview, Options: a.publisherOptions(a.metrics, "trustbundle")})
	if err != nil {
		return err
	}
	a.source.OnChange(p.Trigger)
	a.add(component.Component{Name: "trustbundle", Leader: true, Run: p.Run})
	return nil
}

// publishRootConfigMaps makes the leader publish the roots as Istio's
// istio-ca-root-cert ConfigMap.
func (a *app) publishRootConfigMaps(context.Context) error {
	if !a.cfg.IstioRootConfigMap {
		return nil
	}
	opts := a.publisherOptions(a.metrics.RootConfigMaps(), "rootconfigmap")
	cfg := configmap.Config{Client: a.kube.rootConfigMaps, NamespaceSelector: a.cfg.IstioRootNamespaces, Options: opts}
	if len(a.cfg.federatedRootConfigMaps()) > 0 {
		cfg.Peers, cfg.OurDNSDomains, cfg.LeftOut = a.rootConfigMapPeers, a.ourDNSDomains(),
			a.leftOutMetric("istio_root_configmap", func(string) bool { return true })
	}
	p, err := configmap.New(cfg)
	if err != nil {
		return err
	}
	a.source.OnChange(p.Trigger)
	if a.cfg.Federation != nil {
		for _, peer := range a.cfg.Federation.Peers {
			if peer.IstioRootConfigMap {
				a.peerTriggers[peer.TrustDomain] = append(a.peerTriggers[peer.TrustDomain], p.Trigger)
			}
		}
	}
	a.add(component.Component{Name: "rootconfigmap", Leader: true, Run: p.Run})
	return nil
}

// keepIstiodCert makes the leader keep istiod's serving certificate in
// the Secret Istio's chart mounts.
func (a *app) keepIstiodCert(context.Context) error {
	if !a.cfg.IstiodCert {
		return nil
	}
	p, err := istiodcert.New(istiodcert.Config{Client: a.kube.istiodCert, Issuer: a.authority,
		Namespace: a.cfg.IstiodNamespace, SecretName: a.cfg.IstiodCertSecret, DNSNames: a.cfg.IstiodDNSNames,
		TTL: a.cfg.IstiodCertTTL, Holding: a.metrics.IstiodCertExpiry,
		Options: a.publisherOptions(a.metrics.IstiodCerts(), "istiodcert")})
	if err != nil {
		return err
	}
	a.source.OnChange(p.Trigger)
	a.add(component.Component{Name: "istiodcert", Leader: true, Run: p.Run})
	return nil
}

// publisherOptions are a trust publisher's settings: the authority's
// roots, reported to obs, logged as component name.
func (a *app) publisherOptions(obs trust.Observer, name string) trust.Options {
	return trust.Options{TrustDomain: a.cfg.TrustDomain, Roots: a.authority.Roots, Observer: obs,
		Logger: a.log.With("component", name)}
}

// buildServer wires authentication, authorization and the gRPC server.
func (a *app) buildServer(ctx context.Context) error {
	var err error
	if a.local, err = cluster.New(a.clusterConfig(a.cfg.ClusterID, cluster.Clients{
		Reviews: a.kube.reviews, Pods: a.kube.pods, Accounts: a.kube.accounts}, a.log)); err != nil {
		return err
	}
	// The first requests need not wait for the keys (nor, without them,
	// go to TokenReviews): a failure is logged, and retried on use.
	a.local.Prefetch(ctx)
	if a.cfg.TokenLocal && a.local.Issuer() != "" {
		a.log.Info("tokens are verified locally", "issuer", a.local.Issuer())
	}
	a.add(a.local.Components()...)
	a.add(component.Component{Name: "ca", Ready: admin.Cached(a.authority.Probe, 10*time.Second, nil)})
	var remote func(string) (server.RemoteCluster, bool)
	if err := a.serveRemoteClusters(); err != nil {
		return err
	}
	if a.remotes != nil {
		remote = func(id string) (server.RemoteCluster, bool) {
			if c, ok := a.remotes.Cluster(id); ok {
				return c, true
			}
			return nil, false
		}
	}
	a.readiness = admin.NewReadiness(a.checks()...)
	guard := server.NewConnGuard(server.ConnGuardConfig{Deadline: a.cfg.AuthDeadline, MaxPerAddress: a.cfg.MaxUnauthPerAddr,
		Observer: newConnMetrics(a.reg)})
	a.svc, err = server.NewService(server.Config{Connections: guard,
		Authenticator: a.local, Authorizer: a.local, Pipeline: a.pipeline, Logger: a.log,
		Ready:     func() error { return a.readiness.Err(context.Background()) },
		ClusterID: a.cfg.ClusterID, Remote: remote,
		MaxConcurrentSigns: a.cfg.MaxConcurrentSigns, QueueTimeout: a.cfg.SignQueueTimeout,
		MaxQueued: a.cfg.MaxQueued, MaxQueuedPerNode: a.cfg.MaxQueuedPerNode,
	})
	if err != nil {
		return err
	}
	a.serving, err = server.NewServingCert(ctx, server.ServingCertConfig{Issuer: a.authority, DNSNames: a.cfg.ServingDNSNames, TTL: a.cfg.ServingTTL, Logger: a.log})
	if err != nil {
		return err
	}
	if a.lis, err = net.Listen("tcp", a.cfg.ListenAddr); err != nil {
		return fmt.Errorf("--listen-addr: %w", err)
	}
	a.lis = guard.Listener(server.LimitConnections(a.lis, a.cfg.MaxConns))
	grpcMetrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	a.reg.MustRegister(grpcMetrics)
	transport := server.Transport{
		MaxConnectionAge: a.cfg.MaxConnAge, MaxConnectionAgeGrace: a.cfg.GracePeriod,
		MaxConnectionIdle: a.cfg.MaxConnIdle, MaxStreams: a.cfg.MaxStreams,
		BusyConnections: a.cfg.BusyConns, BusyMaxStreams: a.cfg.BusyMaxStreams,
		MaxHeaderListSize: uint32(a.cfg.MaxHeaderBytes), HandshakeTimeout: server.DefaultHandshakeTimeout,
	}
	a.grpc = server.NewGRPCServer(a.svc, server.TLSConfig(a.serving.GetCertificate, a.cfg.TLSMinVersion),
		append(transport.Options(), grpc.ChainUnaryInterceptor(grpcMetrics.UnaryServerInterceptor(),
			recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(recoverPanic(a.log)))))...).
		WithBusyTier(transport)
	grpcMetrics.InitializeMetrics(a.grpc)
	a.grpc.GracePeriod, a.grpc.ShutdownDelay = a.cfg.GracePeriod, a.cfg.ShutdownDelay
	return nil
}

// clusterConfig is the configuration of the checks of cluster id, whose
// API server clients reach: the same flags for every cluster, each with
// its own clients, rate limits, caches and indexes.
func (a *app) clusterConfig(id string, clients cluster.Clients, log *slog.Logger) cluster.Config {
	return cluster.Config{ID: id, Clients: clients, TrustDomain: a.cfg.TrustDomain, NodeAgents: a.cfg.NodeAgents,
		Audiences: a.cfg.TokenAudiences, CacheTTL: a.cfg.TokenCacheTTL, ReviewRate: a.cfg.KubeQPS, ReviewBurst: a.cfg.KubeBurst,
		Local: a.cfg.TokenLocal, KeysRefresh: a.cfg.TokenKeysRefresh, Observer: a.metrics, Logger: log}
}

// serveRemoteClusters wires the remote clusters of --remote-kubeconfigs
// and --remote-cluster-secrets: every replica runs each one's checks.
func (a *app) serveRemoteClusters() error {
	if !a.cfg.RemoteSecrets && len(a.cfg.RemoteKubeconfigs) == 0 {
		return nil
	}
	log := a.log.With("component", "remote-clusters")
	r, err := cluster.NewRemotes(cluster.RemotesConfig{Local: a.cfg.ClusterID, Build: a.buildRemote, Observer: a.metrics, Logger: log})
	if err != nil {
		return err
	}
	files := map[string][]byte{}
	for id, path := range a.cfg.RemoteKubeconfigs {
		if files[id], err = os.ReadFile(path); err != nil { //nolint:gosec // the operator's kubeconfig files
			return fmt.Errorf("--remote-kubeconfigs: cluster %s: %w", id, err)
		}
	}
	r.Set("--remote-kubeconfigs", cluster.Trusted, files)
	a.remotes = r
	a.add(component.Component{Name: "remote-clusters", Run: r.Run})
	if a.cfg.RemoteSecrets {
		a.add(component.Component{Name: "remote-cluster-secrets", Run: func(ctx context.Context) error {
			return cluster.WatchSecrets(ctx, a.kube.remoteSecrets, a.cfg.RemoteSecretsNS, r, log)
		}})
	}
	return nil
}

// buildRemote wires the checks of remote cluster id, with clients of its
// own (and the same rate limits as the local cluster's).
func (a *app) buildRemote(id string, cfg *rest.Config) (*cluster.Cluster, error) {
	cfg.UserAgent = "workload-ca/" + version + " (cluster " + id + ")"
	k, err := kubeClientsFor(cfg, float32(a.cfg.KubeQPS), a.cfg.KubeBurst)
	if err != nil {
		return nil, err
	}
	return cluster.New(a.clusterConfig(id, cluster.Clients{Reviews: k.reviews, Pods: k.pods, Accounts: k.accounts}, a.log))
}

// recoverPanic answers a panic that a gRPC handler did not turn into an
// error itself: its stack goes to log, never to the caller (the
// interceptor's default handler sends it in the status message).
func recoverPanic(log *slog.Logger) recovery.RecoveryHandlerFunc {
	return func(p any) error {
		log.Error("panic in a gRPC handler", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	}
}

// checks are the components' readiness checks, in the order they were
// added.
func (a *app) checks() []admin.Check {
	var out []admin.Check
	for _, c := range a.components {
		if c.Ready != nil {
			out = append(out, admin.Check{Name: c.Name, Check: c.Ready})
		}
	}
	return out
}

// buildAdmin serves /metrics, /healthz and /readyz, and exports the state
// that lives elsewhere (pod index, CA certificates) at scrape time.
func (a *app) buildAdmin(context.Context) error {
	metrics.WatchPodIndex(a.reg, func() metrics.PodIndexStats {
		pods := a.local.Pods()
		s := pods.Stats()
		return metrics.PodIndexStats{Synced: pods.HasSynced(), Pods: s.Pods, Nodes: s.Nodes,
			ServiceAccounts: s.ServiceAccounts, Lookups: s.Lookups, LookupsRefused: s.LookupsRefused}
	})
	metrics.WatchAuthn(a.reg, func() metrics.AuthnStats {
		accounts := a.local.Accounts()
		return metrics.AuthnStats{PendingReviews: a.local.Reviewer().Pending(), QueuedRequests: a.svc.Queued(),
			Accounts: accounts.Len(), AccountsSynced: accounts.HasSynced()}
	})
	caState := func() metrics.CAState {
		st := metrics.CAState{Signing: a.authority.SigningCert(), Roots: a.authority.Roots(),
			Intermediates: a.authority.Intermediates(), Serving: a.serving.Current().Leaf}
		st.Phase = a.source.Phase()
		if step, at := a.source.NextRotation(); step != rotation.StepNone {
			st.NextStep, st.NextStepAt = string(step), at
		}
		return st
	}
	metrics.WatchCA(a.reg, caState)
	if a.cfg.IstioMetrics {
		metrics.WatchCAIstio(a.reg, caState)
	}
	var err error
	if a.adminLis, err = net.Listen("tcp", a.cfg.AdminAddr); err != nil {
		return fmt.Errorf("--admin-addr: %w", err)
	}
	return nil
}

// run serves until ctx ends: every replica indexes pods, follows its CA
// material and serves; the leader also runs the writers. When ctx ends the
// leader hands over at once, while what requests need (the pod index, the
// CA material, the admin endpoint) runs until the gRPC server has drained:
// it keeps serving for --shutdown-delay first.
func (a *app) run(ctx context.Context) error {
	a.log.Info("serving", "addr", a.lis.Addr().String(), "admin_addr", a.adminLis.Addr().String(), "trust_domain", a.cfg.TrustDomain.String(), "version", version)
	base, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	g, serving := errgroup.WithContext(base) // ends when the gRPC server has stopped, or on a failure
	shutdown, stopShutdown := context.WithCancel(serving)
	defer stopShutdown()
	defer context.AfterFunc(ctx, stopShutdown)()
	g.Go(func() error {
		defer stopServing()
		return a.grpc.Serve(shutdown, a.lis)
	})
	adminSrv := admin.New(admin.Config{Gatherer: a.reg, Readiness: a.readiness, Pprof: a.cfg.Pprof, Logger: a.log.With("component", "admin")})
	g.Go(func() error { return adminSrv.Serve(serving, a.adminLis) })
	var leaderTasks []leader.Task
	for _, c := range a.components {
		switch {
		case c.Run == nil:
		case c.Leader:
			leaderTasks = append(leaderTasks, leader.Task{Name: c.Name, Run: c.Run})
		default:
			g.Go(func() error { return c.Run(serving) })
		}
	}
	if len(leaderTasks) > 0 {
		l := leader.New(leader.Config{Client: a.kube.leader, Namespace: a.cfg.LeaderElectionNS, Name: a.cfg.LeaderElectionID,
			Durations: a.cfg.Lease, Tasks: leaderTasks, Logger: a.log.With("component", "leader"), OnChange: a.metrics.SetLeader})
		g.Go(func() error { return l.Run(shutdown) })
	}
	err := g.Wait()
	a.log.Info("stopped", "error", fmt.Sprint(err))
	return err
}

// connMetrics counts the client connections the server closed before any
// caller authenticated on them, by reason (server.Closed*).
type connMetrics struct{ closed *prometheus.CounterVec }

func newConnMetrics(reg prometheus.Registerer) connMetrics {
	m := connMetrics{closed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "workload_ca_unauthenticated_connections_closed_total",
		Help: "Client connections closed before any caller authenticated on them, by reason (auth-deadline, per-address)."}, []string{"reason"})}
	reg.MustRegister(m.closed)
	return m
}

func (m connMetrics) ConnectionClosed(reason string) { m.closed.WithLabelValues(reason).Inc() }
