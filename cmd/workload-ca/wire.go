package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/rest"

	"github.com/workload-ca/workload-ca/authz/cluster"
	"github.com/workload-ca/workload-ca/authz/tokenreview"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/ca/source"
	"github.com/workload-ca/workload-ca/ca/upstream"
	"github.com/workload-ca/workload-ca/internal/component"
	"github.com/workload-ca/workload-ca/internal/kubeclient"
	"github.com/workload-ca/workload-ca/internal/leader"
	"github.com/workload-ca/workload-ca/issuance"
	"github.com/workload-ca/workload-ca/metrics"
	"github.com/workload-ca/workload-ca/podcert"
	"github.com/workload-ca/workload-ca/policy/watch"
	"github.com/workload-ca/workload-ca/server"
	"github.com/workload-ca/workload-ca/server/admin"
	"github.com/workload-ca/workload-ca/trust"
	"github.com/workload-ca/workload-ca/trust/federation"
)

func runServe(ctx context.Context, opts serveOptions, stdout, _ io.Writer) error {
	if opts.process.ValidateOnly {
		return validateServe(ctx, opts, stdout)
	}
	log := opts.process.logger(stdout)
	audit, closeAudit, err := opts.process.auditLogger(log)
	if err != nil {
		return err
	}
	defer closeAudit()
	return serve(ctx, opts, log, audit)
}

// app is the wired CA: its components, each run on every replica or only
// on the leader, and what they share.
type app struct {
	opts      serveOptions
	log       *slog.Logger
	audit     *slog.Logger
	reg       *prometheus.Registry
	metrics   *metrics.Metrics
	kube      *kubeclient.Clients
	source    *source.Source
	authority *ca.Authority
	// clusters are the local cluster's checks and the remote clusters'.
	clusters  *cluster.Set
	pipeline  *issuance.Pipeline
	door      *server.Door
	readiness *admin.Readiness
	adminLis  net.Listener
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
func serve(ctx context.Context, opts serveOptions, log, audit *slog.Logger) error {
	reg := prometheus.NewRegistry()
	a := &app{opts: opts, log: log, audit: audit, reg: reg,
		metrics: metrics.New(reg, metrics.Options{IstioCompat: opts.process.IstioMetrics, Build: readBuild().metrics()})}
	var err error
	if a.kube, err = newKubeClients(opts.process.Kube); err != nil {
		return err
	}
	if err := tokenreview.CheckAccess(ctx, a.kube.Reviews); err != nil {
		return err
	}
	closeKey, err := a.loadCA(ctx)
	if err != nil {
		return err
	}
	defer closeKey()
	steps := []func(context.Context) error{a.buildPipeline, a.federate, a.publishBundles, a.publishRootConfigMaps,
		a.keepIstiodCert, a.buildClusters, a.buildServer, a.signPodCertificates, a.buildAdmin}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return a.run(ctx)
}

// add adds components to run.
func (a *app) add(cs ...component.Component) { a.components = append(a.components, cs...) }

// loadCA loads the CA's material from its Secret or its directory; the
// source's components keep it current.
func (a *app) loadCA(ctx context.Context) (closeKey func(), err error) {
	src, closeKey, err := a.opts.material.Open(ctx, source.Wiring{Client: a.kube.CAState, Upstream: a.kube.Upstream,
		Observer: a.metrics, Logger: a.log,
		WatchUpstream: func(missing func() (time.Time, bool)) upstream.Observer {
			return metrics.WatchUpstream(a.reg, time.Now, missing)
		}})
	if err != nil {
		return nil, err
	}
	a.source, a.authority = src, src.Authority()
	a.add(src.Components()...)
	return closeKey, nil
}

// buildPipeline makes the issuance pipeline both front doors hand their
// requests to, deciding by the issuance policies with --issuance-policies.
func (a *app) buildPipeline(ctx context.Context) error {
	cfg := issuance.Config{Signer: a.authority, Audit: a.audit, Logger: a.log, Observer: a.metrics}
	if a.opts.policies.Enabled {
		w, err := a.opts.policies.Build(ctx, watch.Wiring{Checks: a.kube.PolicyChecks, Policies: a.kube.Policies, Metadata: a.kube.Labels,
			Cluster: a.opts.clusters.ID, Observer: a.metrics, TTL: a.authority.TTL, Logger: a.log.With("component", "policy")})
		if err != nil {
			return err
		}
		a.add(component.Component{Name: "issuance-policies", Run: w.Run, Ready: w.Ready})
		cfg.Policy = w
	}
	var err error
	a.pipeline, err = issuance.New(cfg)
	return err
}

// buildClusters wires the checks of the local cluster's callers and of
// the remote clusters', on every replica.
func (a *app) buildClusters(ctx context.Context) error {
	p := a.opts.process
	set, err := a.opts.clusters.Build(ctx, cluster.Wiring{
		Local:      cluster.Clients{Reviews: a.kube.Reviews, Pods: a.kube.Pods, Accounts: a.kube.Accounts},
		ClientsFor: remoteClients(p), Secrets: a.kube.RemoteSecrets, Tokens: a.opts.tokens,
		TrustDomain: a.opts.material.TrustDomain, ReviewRate: p.Kube.QPS, ReviewBurst: p.Kube.Burst,
		Observer: a.metrics, Logger: a.log})
	if err != nil {
		return err
	}
	a.clusters = set
	a.add(set.Components...)
	a.add(component.Component{Name: "ca", Ready: admin.Cached(a.authority.Probe, 10*time.Second, nil)})
	return nil
}

// remoteClients makes a remote cluster's clients, with the same rate
// limits as the local cluster's.
func remoteClients(p processOptions) func(id string, cfg *rest.Config) (cluster.Clients, error) {
	return func(id string, cfg *rest.Config) (cluster.Clients, error) {
		cfg.UserAgent = "workload-ca/" + version + " (cluster " + id + ")"
		k, err := kubeclient.For(cfg, float32(p.Kube.QPS), p.Kube.Burst)
		if err != nil {
			return cluster.Clients{}, err
		}
		return cluster.Clients{Reviews: k.Reviews, Pods: k.Pods, Accounts: k.Accounts}, nil
	}
}

// buildServer wires the gRPC door to the clusters' checks and the
// pipeline.
func (a *app) buildServer(ctx context.Context) error {
	var remote func(string) (server.RemoteCluster, bool)
	if r := a.clusters.Remotes; r != nil {
		remote = func(id string) (server.RemoteCluster, bool) {
			if c, ok := r.Cluster(id); ok {
				return c, true
			}
			return nil, false
		}
	}
	a.readiness = admin.NewReadiness(a.checks()...)
	local := a.clusters.Local
	door, err := a.opts.serving.Build(ctx, server.Wiring{Authenticator: local, Authorizer: local,
		ClusterID: a.opts.clusters.ID, Remote: remote, Pipeline: a.pipeline, Issuer: a.authority,
		Ready:      func() error { return a.readiness.Err(context.Background()) },
		Registerer: a.reg, Logger: a.log})
	a.door = door
	return err
}

// signPodCertificates makes the leader sign the PodCertificateRequests
// addressed to --signer-name.
func (a *app) signPodCertificates(context.Context) error {
	if !a.opts.podCerts.Enabled {
		return nil
	}
	cfg := podcert.Config{Client: a.kube.PodCerts, SignerName: a.opts.bundles.SignerName, TrustDomain: a.opts.material.TrustDomain, ClusterID: a.opts.clusters.ID,
		Signer: a.authority, Pipeline: a.pipeline, Observer: a.metrics, Logger: a.log.With("component", "podcert"),
		Pods: a.clusters.Local.Pods(), Accounts: a.clusters.Local.Accounts()}
	a.opts.podCerts.ApplyTo(&cfg)
	c, err := podcert.New(cfg)
	if err != nil {
		return err
	}
	a.add(component.Component{Name: "podcert", Leader: true, Run: c.Run})
	return nil
}

// publisherOptions are a trust publisher's settings: the authority's
// roots, reported to obs, logged as component name.
func (a *app) publisherOptions(obs trust.Observer, name string) trust.Options {
	return trust.Options{TrustDomain: a.opts.material.TrustDomain, Roots: a.authority.Roots, Observer: obs,
		Logger: a.log.With("component", name)}
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
	local := a.clusters.Local
	metrics.WatchPodIndex(a.reg, func() metrics.PodIndexStats {
		pods := local.Pods()
		s := pods.Stats()
		return metrics.PodIndexStats{Synced: pods.HasSynced(), Pods: s.Pods, Nodes: s.Nodes,
			ServiceAccounts: s.ServiceAccounts, Lookups: s.Lookups, LookupsRefused: s.LookupsRefused}
	})
	metrics.WatchAuthn(a.reg, func() metrics.AuthnStats {
		accounts := local.Accounts()
		return metrics.AuthnStats{PendingReviews: local.Reviewer().Pending(), QueuedRequests: a.door.Service.Queued(),
			Accounts: accounts.Len(), AccountsSynced: accounts.HasSynced()}
	})
	metrics.WatchCA(a.reg, a.caState)
	if a.opts.process.IstioMetrics {
		metrics.WatchCAIstio(a.reg, a.caState)
	}
	var err error
	if a.adminLis, err = net.Listen("tcp", a.opts.process.AdminAddr); err != nil {
		return fmt.Errorf("--admin-addr: %w", err)
	}
	return nil
}

// caState is the CA's state as the metrics export it.
func (a *app) caState() metrics.CAState {
	st := metrics.CAState{Signing: a.authority.SigningCert(), Roots: a.authority.Roots(),
		Intermediates: a.authority.Intermediates(), Serving: a.door.Serving.Current().Leaf}
	st.Phase = a.source.Phase()
	if step, at := a.source.NextRotation(); step != rotation.StepNone {
		st.NextStep, st.NextStepAt = string(step), at
	}
	return st
}

// run serves until ctx ends: every replica indexes pods, follows its CA
// material and serves; the leader also runs the writers. When ctx ends the
// leader hands over at once, while what requests need (the pod index, the
// CA material, the admin endpoint) runs until the gRPC server has drained:
// it keeps serving for --shutdown-delay first.
func (a *app) run(ctx context.Context) error {
	a.log.Info("serving", "addr", a.door.Listener.Addr().String(), "admin_addr", a.adminLis.Addr().String(),
		"trust_domain", a.opts.material.TrustDomain.String(), "version", version)
	base, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	g, serving := errgroup.WithContext(base) // ends when the gRPC server has stopped, or on a failure
	shutdown, stopShutdown := context.WithCancel(serving)
	defer stopShutdown()
	defer context.AfterFunc(ctx, stopShutdown)()
	g.Go(func() error {
		defer stopServing()
		return a.door.Server.Serve(shutdown, a.door.Listener)
	})
	adminSrv := admin.New(admin.Config{Gatherer: a.reg, Readiness: a.readiness, Pprof: a.opts.process.Pprof, Logger: a.log.With("component", "admin")})
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
		lo := a.opts.process.Leader
		l := leader.New(leader.Config{Client: a.kube.Leader, Namespace: lo.Namespace, Name: lo.Name,
			Durations: lo.Durations, Tasks: leaderTasks, Logger: a.log.With("component", "leader"), OnChange: a.metrics.SetLeader})
		g.Go(func() error { return l.Run(shutdown) })
	}
	err := g.Wait()
	a.log.Info("stopped", "error", fmt.Sprint(err))
	return err
}
