package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/authz/podindex"
	"github.com/workload-ca/workload-ca/authz/saindex"
	"github.com/workload-ca/workload-ca/authz/tokenreview"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/metrics"
	"github.com/workload-ca/workload-ca/podcert"
	"github.com/workload-ca/workload-ca/server"
	"github.com/workload-ca/workload-ca/server/admin"
	"github.com/workload-ca/workload-ca/trust"
	"github.com/workload-ca/workload-ca/trust/clustertrustbundle"
	"github.com/workload-ca/workload-ca/trust/configmap"
)

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseServeFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: cfg.LogLevel}))
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

// app is the wired CA: what every replica runs, and what only the leader
// runs.
type app struct {
	cfg       serveConfig
	log       *slog.Logger
	audit     *slog.Logger
	reg       *prometheus.Registry
	metrics   *metrics.Metrics
	kube      *kubeClients
	authority *ca.Authority
	pods      *podindex.Index
	// accounts is the service account index the token checks read.
	accounts  *saindex.Index
	reviewer  *tokenreview.Reviewer
	svc       *server.Service
	serving   *server.ServingCert
	readiness *admin.Readiness
	grpc      *server.GRPCServer
	lis       net.Listener
	adminLis  net.Listener
	// phase reports the rotation phase for metrics (nil: no rotation).
	phase func() string
	// pluginRoot is the root CA of --ca-root-dir (reloaded when the
	// directory changes), which issues the intermediates; nil otherwise.
	pluginRoot atomic.Pointer[ca.Material]
	// pluginRootsSeen times the plug-in bundle's roots, for the move to a
	// new signing root; pluginRootChanged wakes the leader's record of
	// them (recordRootsSeen).
	pluginRootsSeen   rootsSeen
	pluginRootChanged chan struct{}
	// rotator rotates the CA state of --ca-secret (on the leader).
	rotator *rotation.Rotator
	// issuer is the plug-in root the rotator follows (nil without
	// --ca-root-dir).
	issuer func() rotation.Issuer
	// caKey is the key of --ca-key-uri (nil: the key is a file).
	caKey *keystore.Key
	// caStore is the CA state Secret (--ca-secret).
	caStore *castate.SecretStore
	// extraChecks are readiness checks of the CA source.
	extraChecks []admin.Check
	// replicaTasks run on every replica; leaderTasks on the leader only.
	replicaTasks []func(ctx context.Context) error
	leaderTasks  []leaderTask
	// onMaterial is called after the CA's material changed.
	onMaterial []func()
}

// serve wires the CA and runs it until ctx ends.
func serve(ctx context.Context, cfg serveConfig, log, audit *slog.Logger) error {
	reg := prometheus.NewRegistry()
	a := &app{cfg: cfg, log: log, audit: audit, reg: reg, pluginRootChanged: make(chan struct{}, 1),
		metrics: metrics.New(reg, metrics.Options{IstioCompat: cfg.IstioMetrics})}
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
	steps := []func(context.Context) error{a.loadCA, a.publishBundles, a.publishRootConfigMaps, a.buildServer, a.signPodCertificates, a.buildAdmin}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return a.run(ctx)
}

// loadCA loads the CA from its Secret or its directory and keeps following
// it on every replica.
func (a *app) loadCA(ctx context.Context) error {
	if a.cfg.CASecret.Name != "" {
		return a.loadCASecret(ctx)
	}
	return a.loadCADir()
}

// loadCADir loads the CA from --ca-dir (generating a root there on first
// start, unless the key is in a KMS) and reloads it when the files change.
func (a *app) loadCADir() error {
	var m *ca.Material
	var err error
	if key := a.caKeySigner(); key != nil {
		m, err = keystore.LoadDir(a.cfg.CADir, key)
	} else {
		var created bool
		m, created, err = keystore.LoadOrCreate(a.cfg.CADir, keystore.GenerateOptions{KeyType: a.cfg.CAKeyType, TrustDomain: a.cfg.TrustDomain}, time.Now())
		if created {
			a.log.Info("generated a self-signed root", "dir", a.cfg.CADir, "key_type", a.cfg.CAKeyType)
		}
	}
	if err != nil {
		return err
	}
	if err := a.newAuthority(m); err != nil {
		return err
	}
	w, err := keystore.NewDirWatcher(keystore.DirWatcherConfig{Dir: a.cfg.CADir, Key: a.caKeySigner(), Interval: a.cfg.CADirPoll,
		Apply: a.setMaterial, Logger: a.log.With("component", "ca-dir")})
	if err != nil {
		return err
	}
	a.replicaTasks = append(a.replicaTasks, w.Run)
	return nil
}

// loadCASecret loads the CA's roots, or with --ca-root-dir its
// intermediates, from --ca-secret (the first replica creates it), follows
// the Secret on every replica, and has the leader drive rotation.
func (a *app) loadCASecret(ctx context.Context) error {
	policy, err := a.cfg.rotationPolicy()
	if err != nil {
		return err
	}
	generate, err := a.caGenerator(policy)
	if err != nil {
		return err
	}
	store, err := castate.NewSecretStore(castate.SecretConfig{Client: a.kube.caState, Namespace: a.cfg.CASecret.Namespace,
		Name: a.cfg.CASecret.Name, Generate: generate, Roots: a.externalRoots(), Logger: a.log.With("component", "ca-secret")})
	if err != nil {
		return err
	}
	st, err := store.LoadOrCreate(ctx)
	if err != nil {
		return err
	}
	m, err := st.MaterialUnder(store.Roots())
	if err != nil {
		return err
	}
	if err := a.newAuthority(m); err != nil {
		return err
	}
	a.caStore = store
	a.issuer = a.pluginIssuer(policy.PropagationDelay)
	rot, err := rotation.New(rotation.Config{Store: store, Generate: generate, Policy: policy,
		Issuer: a.issuer, Observer: a.metrics, Logger: a.log.With("component", "rotation")})
	if err != nil {
		return err
	}
	a.rotator = rot
	if err := a.watchRootDir(); err != nil {
		return err
	}
	a.onMaterial = append(a.onMaterial, rot.Notify)
	a.replicaTasks = append(a.replicaTasks, func(ctx context.Context) error { return store.Run(ctx, a.followState) })
	a.leaderTasks = append(a.leaderTasks, leaderTask{name: "rotation", run: rot.Run})
	if a.cfg.CARootDir != "" {
		a.leaderTasks = append(a.leaderTasks, leaderTask{name: "roots-seen", run: a.recordRootsSeen})
	}
	a.phase = func() string { return store.Current().Phase() }
	a.extraChecks = append(a.extraChecks, admin.Check{Name: "ca-secret", Check: func(context.Context) error {
		return syncedErr(store.HasSynced())
	}})
	return nil
}

// caGenerator returns how the CA's next authority is made: a self-signed
// root, or with --ca-root-dir an intermediate issued by the plug-in root,
// which it loads as a.pluginRoot (the current one at each call: the
// directory is reloaded).
func (a *app) caGenerator(policy rotation.Policy) (func(time.Time) (*ca.Material, error), error) {
	opts := keystore.GenerateOptions{KeyType: a.cfg.CAKeyType, TrustDomain: a.cfg.TrustDomain, Lifetime: policy.CATTL}
	if a.cfg.CARootDir == "" {
		return func(now time.Time) (*ca.Material, error) { return keystore.GenerateRoot(opts, now) }, nil
	}
	root, err := keystore.LoadRootDir(a.cfg.CARootDir, a.caKeySigner())
	if err != nil {
		return nil, err
	}
	a.pluginRoot.Store(root)
	a.pluginRootsSeen.observe(root.Roots, time.Now())
	a.log.Info("plug-in root loaded; signing with intermediates issued by it", "dir", a.cfg.CARootDir,
		"root", root.Cert.Subject.String(), "not_after", root.Cert.NotAfter, "roots", len(root.Roots))
	return func(now time.Time) (*ca.Material, error) {
		return keystore.GenerateIntermediate(a.pluginRoot.Load(), opts, now)
	}, nil
}

// pluginIssuer returns, with --ca-root-dir, the current plug-in root for
// the rotator and when it is trusted everywhere: delay after this process
// first saw it in the bundle. Without --ca-root-dir it returns nil.
func (a *app) pluginIssuer(delay time.Duration) func() rotation.Issuer {
	if a.cfg.CARootDir == "" {
		return nil
	}
	return func() rotation.Issuer {
		root := a.pluginRoot.Load()
		return rotation.Issuer{Cert: root.Cert, TrustedFrom: a.pluginRootsSeen.since(root.Cert, time.Now()).Add(delay)}
	}
}

// externalRoots are the plug-in root's trust bundle, or nil for
// self-signed roots.
func (a *app) externalRoots() []*x509.Certificate {
	if r := a.pluginRoot.Load(); r != nil {
		return r.Roots
	}
	return nil
}

// watchRootDir reloads the plug-in root when --ca-root-dir changes.
func (a *app) watchRootDir() error {
	if a.cfg.CARootDir == "" {
		return nil
	}
	w, err := keystore.NewDirWatcher(keystore.DirWatcherConfig{Dir: a.cfg.CARootDir, Root: true, Key: a.caKeySigner(),
		Interval: a.cfg.CADirPoll, Apply: a.setPluginRoot, Logger: a.log.With("component", "ca-root-dir")})
	if err != nil {
		return err
	}
	a.replicaTasks = append(a.replicaTasks, w.Run)
	return nil
}

// setPluginRoot installs a changed plug-in root: its bundle becomes the
// trust bundle (what the Secret's intermediates are checked against) and
// it issues the intermediates minted from now on; a new signing root takes
// over once it has been in the bundle for the propagation delay (see
// rotation.PlanUnder). Bundles that drop the
// issuer of an intermediate still in the Secret are refused, and the
// previous root keeps serving. The store hands the Secret's state to
// followState again, which installs it under the new bundle (and so
// publishes it); installing it here too could race a newer state.
func (a *app) setPluginRoot(root *ca.Material) error {
	if err := a.caStore.SetRoots(root.Roots); err != nil {
		return err
	}
	a.pluginRootsSeen.observe(root.Roots, time.Now())
	previous := a.pluginRoot.Swap(root)
	if previous == nil || !previous.Cert.Equal(root.Cert) {
		a.log.Info("new plug-in signing root: the leader moves to intermediates it issues once every verifier trusts it",
			"root", root.Cert.Subject.String(), "not_after", root.Cert.NotAfter, "trusted_from", a.issuer().TrustedFrom)
	}
	// On the leader, record the new bundle's roots in the Secret.
	select {
	case a.pluginRootChanged <- struct{}{}:
	default:
	}
	// SetRoots woke the rotator before the new root was stored here.
	a.rotator.Notify()
	return nil
}

// followState installs the material of a new CA state seen in the Secret.
func (a *app) followState(st castate.State) {
	m, err := st.MaterialUnder(a.caStore.Roots())
	if err == nil {
		err = a.setMaterial(m)
	}
	if err != nil {
		a.log.Error("refused CA state from the Secret; the previous CA keeps serving", "error", err.Error())
		return
	}
	a.log.Info("CA state updated", "phase", st.Phase(), "signing", m.Cert.Subject.String(), "roots", len(m.Roots))
}

func (a *app) newAuthority(m *ca.Material) error {
	var err error
	a.authority, err = ca.New(ca.Config{TrustDomain: a.cfg.TrustDomain, DefaultTTL: a.cfg.DefaultTTL, MaxTTL: a.cfg.MaxTTL}, m)
	if err != nil {
		return err
	}
	sc := a.authority.SigningCert()
	a.log.Info("CA loaded", "subject", sc.Subject.String(), "not_after", sc.NotAfter, "roots", len(a.authority.Roots()))
	return nil
}

// setMaterial installs validated material and tells whoever follows it.
func (a *app) setMaterial(m *ca.Material) error {
	if err := a.authority.SetMaterial(m); err != nil {
		return err
	}
	for _, f := range a.onMaterial {
		f()
	}
	return nil
}

// signPodCertificates makes the leader sign the PodCertificateRequests
// addressed to --signer-name.
func (a *app) signPodCertificates(context.Context) error {
	if !a.cfg.PodCertificates {
		return nil
	}
	c, err := podcert.New(podcert.Config{Client: a.kube.podCerts, SignerName: a.cfg.SignerName, TrustDomain: a.cfg.TrustDomain,
		Signer: a.authority, Audit: a.audit, Observer: a.metrics, Logger: a.log.With("component", "podcert"),
		Workers: a.cfg.PodCertWorkers, Pods: a.pods, Accounts: a.accounts})
	if err != nil {
		return err
	}
	a.leaderTasks = append(a.leaderTasks, leaderTask{name: "podcert", run: c.Run})
	return nil
}

// publishBundles makes the leader publish the roots as ClusterTrustBundles.
func (a *app) publishBundles(context.Context) error {
	if !a.cfg.PublishTrustBundle {
		return nil
	}
	p, err := clustertrustbundle.New(clustertrustbundle.Config{Client: a.kube.bundles, SignerName: a.cfg.SignerName, IstioCompatible: a.cfg.IstioCompatible, Options: trust.Options{TrustDomain: a.cfg.TrustDomain, Roots: a.authority.Roots, Observer: a.metrics, Logger: a.log.With("component", "trustbundle")}})
	if err != nil {
		return err
	}
	a.onMaterial = append(a.onMaterial, p.Trigger)
	a.leaderTasks = append(a.leaderTasks, leaderTask{name: "trustbundle", run: p.Run})
	return nil
}

// publishRootConfigMaps makes the leader publish the roots as Istio's
// istio-ca-root-cert ConfigMap.
func (a *app) publishRootConfigMaps(context.Context) error {
	if !a.cfg.IstioRootConfigMap {
		return nil
	}
	p, err := configmap.New(configmap.Config{Client: a.kube.rootConfigMaps, NamespaceSelector: a.cfg.IstioRootNamespaces, Options: trust.Options{TrustDomain: a.cfg.TrustDomain, Roots: a.authority.Roots, Observer: a.metrics.RootConfigMaps(), Logger: a.log.With("component", "rootconfigmap")}})
	if err != nil {
		return err
	}
	a.onMaterial = append(a.onMaterial, p.Trigger)
	a.leaderTasks = append(a.leaderTasks, leaderTask{name: "rootconfigmap", run: p.Run})
	return nil
}

// buildServer wires authentication, authorization and the gRPC server.
func (a *app) buildServer(ctx context.Context) error {
	a.pods = podindex.New(podindex.Config{Client: a.kube.pods, Logger: a.log.With("component", "podindex")})
	reviewer, err := a.authenticator(ctx)
	if err != nil {
		return err
	}
	policy, err := authz.NewPolicy(authz.PolicyConfig{TrustDomain: a.cfg.TrustDomain, NodeAgents: a.cfg.NodeAgents, Pods: a.pods})
	if err != nil {
		return err
	}
	a.readiness = admin.NewReadiness(append([]admin.Check{
		{Name: "pod-index", Check: func(context.Context) error { return syncedErr(a.pods.HasSynced()) }},
		{Name: "service-account-index", Check: func(context.Context) error { return syncedErr(a.accounts.HasSynced()) }},
		{Name: "ca", Check: admin.Cached(a.authority.Probe, 10*time.Second, nil)},
	}, a.extraChecks...)...)
	a.svc, err = server.NewService(server.Config{
		Authenticator: reviewer, Authorizer: policy, Signer: a.authority, Logger: a.log, Audit: a.audit,
		Observer: a.metrics, Ready: func() error { return a.readiness.Err(context.Background()) }, ClusterID: a.cfg.ClusterID,
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
		return err
	}
	a.lis = server.LimitConnections(a.lis, a.cfg.MaxConns)
	grpcMetrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	a.reg.MustRegister(grpcMetrics)
	transport := server.Transport{
		MaxConnectionAge: a.cfg.MaxConnAge, MaxConnectionAgeGrace: a.cfg.GracePeriod,
		MaxConnectionIdle: a.cfg.MaxConnIdle, MaxStreams: a.cfg.MaxStreams,
		MaxHeaderListSize: uint32(a.cfg.MaxHeaderBytes), HandshakeTimeout: server.DefaultHandshakeTimeout,
	}
	a.grpc = server.NewGRPCServer(a.svc, server.TLSConfig(a.serving.GetCertificate, a.cfg.TLSMinVersion),
		append(transport.Options(), grpc.ChainUnaryInterceptor(grpcMetrics.UnaryServerInterceptor(),
			recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(recoverPanic(a.log)))))...)
	grpcMetrics.InitializeMetrics(a.grpc)
	a.grpc.GracePeriod, a.grpc.ShutdownDelay = a.cfg.GracePeriod, a.cfg.ShutdownDelay
	return nil
}

// authenticator wires token authentication: the issuer's published keys
// (a token none of them signed is refused without a TokenReview), with
// --token-verification=local the service account index that lets
// pod-bound tokens be decided without one, and the TokenReviews for the
// rest, paced at --kube-api-qps.
func (a *app) authenticator(ctx context.Context) (*tokenreview.Reviewer, error) {
	log := a.log.With("component", "tokenreview")
	rest := a.kube.reviews.Discovery().RESTClient()
	keysCfg := tokenreview.IssuerKeysConfig{Fetch: tokenreview.JWKSFetcher(rest), MaxAge: a.cfg.TokenKeysRefresh, Logger: log}
	if a.cfg.TokenLocal {
		keysCfg.FetchConfiguration = tokenreview.DiscoveryFetcher(rest)
	}
	keys, err := tokenreview.NewIssuerKeys(keysCfg)
	if err != nil {
		return nil, err
	}
	// Every replica knows each service account's UID, so that a cached
	// answer stops when its account is deleted or created again.
	accounts, err := saindex.New(saindex.Config{Client: a.kube.accounts, Logger: a.log.With("component", "saindex")})
	if err != nil {
		return nil, err
	}
	a.accounts = accounts
	a.replicaTasks = append(a.replicaTasks, accounts.Run, keys.Run)
	// The first requests need not wait for the keys (nor, without them,
	// go to TokenReviews): a failure is logged, and retried on use.
	keys.Prefetch(ctx)
	if a.cfg.TokenLocal && keys.Issuer() != "" {
		a.log.Info("tokens are verified locally", "issuer", keys.Issuer())
	}
	reviewer, err := tokenreview.New(tokenreview.Config{
		Client: a.kube.reviews.AuthenticationV1(), Audiences: a.cfg.TokenAudiences, MaxCacheTTL: a.cfg.TokenCacheTTL,
		ReviewRate: a.cfg.KubeQPS, ReviewBurst: a.cfg.KubeBurst,
		Pods: a.pods, Keys: keys, Accounts: accounts, Local: a.cfg.TokenLocal, Observer: a.metrics, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	a.reviewer = reviewer
	return reviewer, nil
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

func syncedErr(synced bool) error {
	if !synced {
		return errors.New("initial list not done")
	}
	return nil
}

// buildAdmin serves /metrics, /healthz and /readyz, and exports the state
// that lives elsewhere (pod index, CA certificates) at scrape time.
func (a *app) buildAdmin(context.Context) error {
	metrics.WatchPodIndex(a.reg, func() metrics.PodIndexStats {
		s := a.pods.Stats()
		return metrics.PodIndexStats{Synced: a.pods.HasSynced(), Pods: s.Pods, Nodes: s.Nodes,
			ServiceAccounts: s.ServiceAccounts, Lookups: s.Lookups, LookupsRefused: s.LookupsRefused}
	})
	metrics.WatchAuthn(a.reg, func() metrics.AuthnStats {
		return metrics.AuthnStats{PendingReviews: a.reviewer.Pending(), QueuedRequests: a.svc.Queued(),
			Accounts: a.accounts.Len(), AccountsSynced: a.accounts.HasSynced()}
	})
	metrics.WatchCA(a.reg, func() metrics.CAState {
		st := metrics.CAState{Signing: a.authority.SigningCert(), Roots: a.authority.Roots(),
			Intermediates: a.authority.Intermediates(), Serving: a.serving.Current().Leaf}
		if a.phase != nil {
			st.Phase = a.phase()
		}
		return st
	})
	var err error
	a.adminLis, err = net.Listen("tcp", a.cfg.AdminAddr)
	return err
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
	g.Go(func() error { return a.pods.Run(serving) })
	g.Go(func() error {
		defer stopServing()
		return a.grpc.Serve(shutdown, a.lis)
	})
	adminSrv := admin.New(admin.Config{Gatherer: a.reg, Readiness: a.readiness, Pprof: a.cfg.Pprof, Logger: a.log.With("component", "admin")})
	g.Go(func() error { return adminSrv.Serve(serving, a.adminLis) })
	for _, t := range a.replicaTasks {
		g.Go(func() error { return t(serving) })
	}
	if len(a.leaderTasks) > 0 {
		l := newLeader(a.kube.leader, a.cfg.LeaderElectionNS, a.cfg.LeaderElectionID, a.cfg.Lease, a.log.With("component", "leader"), a.leaderTasks...)
		l.onChange = a.metrics.SetLeader
		g.Go(func() error { return l.Run(shutdown) })
	}
	err := g.Wait()
	a.log.Info("stopped", "error", fmt.Sprint(err))
	return err
}
