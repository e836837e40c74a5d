package cluster

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Build wires the checks of remote cluster id, whose API server cfg
// reaches.
type Build func(id string, cfg *rest.Config) (*Cluster, error)

// Observer is told which remote clusters are configured and whether each
// is ready, and of each kubeconfig refused, for metrics.
type Observer interface {
	RemoteClusters(ready map[string]bool)
	// RemoteKubeconfigRefused: a kubeconfig configures nothing, for reason
	// (a Reason).
	RemoteKubeconfigRefused(reason string)
}

// Trust says who writes a source's kubeconfigs, and so what they may hold.
type Trust int

const (
	// Untrusted kubeconfigs (a Secret's: whoever may write a Secret in the
	// namespace writes them) are checked by CheckKubeconfig, and only the
	// checked fields are used.
	Untrusted Trust = iota
	// Trusted kubeconfigs (the operator's own files) may hold anything
	// client-go loads: exec plugins, files, proxies.
	Trusted
)

// RemotesConfig configures Remotes.
type RemotesConfig struct {
	// Local is the CA's own cluster id: no remote cluster may take it.
	Local string
	Build Build
	// Observer, if set, hears of every change of the set.
	Observer Observer
	Logger   *slog.Logger
}

// Remotes are the remote clusters whose callers the CA serves, each from
// a kubeconfig of one of several sources (a Secret, or the flags), kept
// running while configured: a cluster is added, replaced (its kubeconfig
// changed) or removed without a restart. It is safe for concurrent use.
type Remotes struct {
	cfg RemotesConfig
	log *slog.Logger
	// ctx is the context the clusters run under (Run's).
	ctx context.Context

	mu      sync.Mutex
	sources map[string]*source
	running map[string]*member
	// goroutines are those of every cluster started, stopped or not:
	// Run returns only once they have all ended.
	goroutines sync.WaitGroup
}

// source is what one source configures.
type source struct {
	// digests are those of every kubeconfig set, refused ones too: the
	// same kubeconfigs again (a resync) are neither checked nor logged
	// again.
	digests map[string][sha256.Size]byte
	// configs are the usable ones, by cluster id.
	configs map[string]*config
}

// config is a usable kubeconfig of one cluster.
type config struct {
	rest   *rest.Config
	digest [sha256.Size]byte
}

// member is a running remote cluster.
type member struct {
	c      *Cluster
	source string
	host   string
	digest [sha256.Size]byte
	cancel context.CancelFunc
	done   chan struct{}
}

// NewRemotes returns an empty set; clusters start once Run runs.
func NewRemotes(cfg RemotesConfig) (*Remotes, error) {
	if cfg.Build == nil || cfg.Local == "" {
		return nil, errors.New("cluster: remote clusters need Build and the local cluster's id")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Remotes{cfg: cfg, log: cfg.Logger, sources: map[string]*source{}, running: map[string]*member{}}, nil
}

// Cluster is the running remote cluster id, if configured.
func (r *Remotes) Cluster(id string) (*Cluster, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.running[id]
	if !ok {
		return nil, false
	}
	return m.c, true
}

// IDs are the configured remote clusters' ids, sorted.
func (r *Remotes) IDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.running))
}

// Set replaces what source configures: cluster id → kubeconfig (nil or
// empty: nothing), each checked as trust says. A kubeconfig that does not
// load or is refused configures nothing (the reason is logged and
// counted), so its cluster's callers are refused. A cluster id configured
// by two sources is taken from the first by name, and the conflict logged.
func (r *Remotes) Set(name string, trust Trust, kubeconfigs map[string][]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	digests := make(map[string][sha256.Size]byte, len(kubeconfigs))
	for id, kc := range kubeconfigs {
		digests[id] = sha256.Sum256(kc)
	}
	if prev, ok := r.sources[name]; ok && maps.Equal(prev.digests, digests) {
		return
	}
	if len(kubeconfigs) == 0 {
		delete(r.sources, name)
	} else {
		s := &source{digests: digests, configs: map[string]*config{}}
		for _, id := range slices.Sorted(maps.Keys(kubeconfigs)) {
			cfg, err := load(trust, kubeconfigs[id])
			if err != nil {
				r.refused(id, name, err)
				continue
			}
			s.configs[id] = &config{rest: cfg, digest: digests[id]}
		}
		r.sources[name] = s
	}
	if r.ctx != nil {
		r.reconcile()
	}
}

// load is the client configuration of kubeconfig, checked as trust says.
func load(trust Trust, kubeconfig []byte) (*rest.Config, error) {
	if trust == Trusted {
		cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig: %w", err)
		}
		return cfg, nil
	}
	return CheckKubeconfig(kubeconfig)
}

// refused logs and counts a kubeconfig that configures nothing. The
// caller holds mu.
func (r *Remotes) refused(id, source string, err error) {
	reason := ReasonOf(err)
	r.log.Error("remote cluster kubeconfig refused: the cluster is not added, its callers are refused",
		"cluster", id, "source", source, "reason", string(reason), "error", err)
	if r.cfg.Observer != nil {
		r.cfg.Observer.RemoteKubeconfigRefused(string(reason))
	}
}

// Run starts the configured clusters and keeps them as Set changes them,
// until ctx ends; then it stops them all.
func (r *Remotes) Run(ctx context.Context) error {
	r.mu.Lock()
	r.ctx = ctx
	r.reconcile()
	r.mu.Unlock()
	<-ctx.Done()
	r.mu.Lock()
	var stopped []*member
	for id, m := range r.running {
		r.stop(id, m)
		stopped = append(stopped, m)
	}
	r.observe()
	r.mu.Unlock()
	for _, m := range stopped {
		<-m.done
	}
	r.goroutines.Wait()
	return nil
}

// reconcile makes the running clusters those the sources configure. The
// caller holds mu.
func (r *Remotes) reconcile() {
	type wanted struct {
		source string
		cfg    *config
	}
	want := map[string]wanted{}
	for _, name := range slices.Sorted(maps.Keys(r.sources)) {
		for id, cfg := range r.sources[name].configs {
			switch prev, dup := want[id]; {
			case id == r.cfg.Local:
				r.log.Error("remote cluster ignored: it has the local cluster's id", "cluster", id, "source", name)
			case dup:
				r.log.Error("remote cluster configured twice; the first source is used", "cluster", id, "used", prev.source, "ignored", name)
			default:
				want[id] = wanted{name, cfg}
			}
		}
	}
	for id, m := range r.running {
		if w, ok := want[id]; !ok || w.cfg.digest != m.digest {
			r.stop(id, m)
			if !ok {
				r.log.Info("remote cluster removed: its callers are refused", "cluster", id, "source", m.source)
			}
		}
	}
	for id, w := range want {
		if _, ok := r.running[id]; ok {
			continue
		}
		m, err := r.start(id, w.source, w.cfg)
		if err != nil {
			r.log.Error("remote cluster not started: its callers are refused", "cluster", id, "source", w.source, "error", err)
			continue
		}
		r.running[id] = m
		r.log.Info("remote cluster added", "cluster", id, "source", w.source, "host", m.host)
	}
	r.observe()
}

func (r *Remotes) start(id, source string, cfg *config) (*member, error) {
	// Build may change the configuration (its user agent): it gets a copy.
	c, err := r.cfg.Build(id, rest.CopyConfig(cfg.rest))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(r.ctx)
	m := &member{c: c, source: source, host: cfg.rest.Host, digest: cfg.digest, cancel: cancel, done: make(chan struct{})}
	r.goroutines.Add(2)
	go func() {
		defer r.goroutines.Done()
		defer close(m.done)
		c.Prefetch(ctx)
		if err := c.Run(ctx); err != nil && ctx.Err() == nil {
			r.log.Error("remote cluster stopped: its callers are refused until it is configured again", "cluster", id, "error", err)
		}
	}()
	// Readiness changes once the cluster's indexes have synced.
	go func() {
		defer r.goroutines.Done()
		if c.pods.WaitForSync(ctx) == nil && c.accounts.WaitForSync(ctx) == nil && ctx.Err() == nil {
			r.log.Info("remote cluster ready", "cluster", id)
			r.mu.Lock()
			r.observe()
			r.mu.Unlock()
		}
	}()
	return m, nil
}

// stop stops a running cluster and forgets it. The caller holds mu.
func (r *Remotes) stop(id string, m *member) {
	m.cancel()
	delete(r.running, id)
}

// observe reports the set. The caller holds mu.
func (r *Remotes) observe() {
	if r.cfg.Observer == nil {
		return
	}
	ready := map[string]bool{}
	for id, m := range r.running {
		ready[id] = m.c.Ready() == nil
	}
	r.cfg.Observer.RemoteClusters(ready)
}
