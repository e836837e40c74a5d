package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/issuance"
	"github.com/workload-ca/workload-ca/policy"
)

// GVR is the IssuancePolicy resource.
var GVR = schema.GroupVersionResource{Group: policy.Group, Version: policy.Version, Resource: policy.Resource}

// MaxPolicies bounds the policies the CA decides by: beyond it, the
// policies last in name order refuse as unavailable what they select
// (their status says why).
const MaxPolicies = 1000

// DefaultStatusInterval is how often each replica adds its decisions to
// the policies' status.
const DefaultStatusInterval = 10 * time.Second

// Config wires the watcher. Policies, Metadata and Compiler are required.
type Config struct {
	// Policies reads the IssuancePolicies and writes their status.
	Policies dynamic.Interface
	// Metadata lists the namespaces' and nodes' labels.
	Metadata metadata.Interface
	// Cluster is the local cluster's id: the only cluster whose labels
	// are known.
	Cluster  string
	Compiler *policy.Compiler
	Observer Observer
	// TTL is the lifetime the CA gives a request asking for a TTL
	// (policy.SetConfig.TTL).
	TTL            func(requested time.Duration) time.Duration
	Logger         *slog.Logger
	Clock          clock.WithTicker
	StatusInterval time.Duration
}

// Observer is told of each policy's decisions, and of the policies
// installed (after every change), for metrics.
type Observer interface {
	policy.Observer
	PoliciesInstalled(names, decisions []string)
}

type nopObserver struct{}

func (nopObserver) PolicyDecided(string, string)         {}
func (nopObserver) PoliciesInstalled([]string, []string) {}

// Watcher keeps the current Set of policies: an issuance.Policy.
type Watcher struct {
	cfg      Config
	labels   *labelIndex
	informer cache.SharedIndexInformer
	tally    *policy.Tally
	set      atomic.Pointer[policy.Set]

	mu sync.Mutex
	// compiled caches each policy's compilation by its uid and generation;
	// current is the Set's policies.
	compiled map[string]*policy.Compiled
	current  []*policy.Compiled
	// written is, by policy Key, the generation whose condition this
	// replica has seen in the status: with nothing to add, it is not
	// read again. Only the status loop uses it.
	written map[string]int64
}

// New returns a watcher; Run starts it.
func New(cfg Config) (*Watcher, error) {
	if cfg.Policies == nil || cfg.Metadata == nil || cfg.Compiler == nil {
		return nil, errors.New("policy/watch: clients and a compiler are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = DefaultStatusInterval
	}
	labels, err := newLabelIndex(cfg.Metadata, cfg.Cluster)
	if err != nil {
		return nil, err
	}
	w := &Watcher{cfg: cfg, labels: labels, tally: &policy.Tally{}, compiled: map[string]*policy.Compiled{}}
	w.informer = dynamicinformer.NewFilteredDynamicInformer(cfg.Policies, GVR, "", 0, cache.Indexers{}, nil).Informer()
	rebuild := func(any) { w.rebuild() }
	if _, err := w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: rebuild, DeleteFunc: rebuild,
		UpdateFunc: func(old, o any) {
			// Status writes (every replica's, every interval) change
			// neither; a spec change bumps the generation.
			if keyOf(old) != keyOf(o) {
				w.rebuild()
			}
		},
	}); err != nil {
		return nil, err
	}
	return w, nil
}

// Decide decides r by the policies installed (issuance.Policy). Until the
// policies are listed, it refuses: it cannot know what they would say.
func (w *Watcher) Decide(ctx context.Context, door string, r *issuance.Request, granted spiffeid.ID) (issuance.Verdict, error) {
	set := w.set.Load()
	if set == nil {
		return issuance.Verdict{}, fmt.Errorf("%w: the issuance policies are not listed yet", issuance.ErrNotReady)
	}
	return set.Decide(ctx, door, r, granted)
}

// Ready is nil once the policies and labels are listed.
func (w *Watcher) Ready(context.Context) error {
	if w.set.Load() == nil || !w.labels.synced() {
		return errors.New("issuance policies or namespace and node labels not listed yet")
	}
	return nil
}

// Run watches until ctx ends, and adds this replica's decisions to the
// policies' status every StatusInterval.
func (w *Watcher) Run(ctx context.Context) error {
	go w.labels.namespaces.RunWithContext(ctx)
	go w.labels.nodes.RunWithContext(ctx)
	go w.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), w.informer.HasSynced) {
		return ctx.Err()
	}
	w.rebuild()
	t := w.cfg.Clock.NewTicker(w.cfg.StatusInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// What was decided since the last write is written once
			// more, on a context of its own: a rolling update must not
			// lose a replica's counts.
			flush, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			w.writeStatus(flush)
			cancel()
			return nil
		case <-t.C():
			w.writeStatus(ctx)
		}
	}
}

// rebuild compiles what changed and swaps in the new Set. Before the
// informer has listed, it does nothing: an empty Set would let every
// request through.
func (w *Watcher) rebuild() {
	if !w.informer.HasSynced() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	next := map[string]*policy.Compiled{}
	var out []*policy.Compiled
	for _, obj := range w.informer.GetStore().List() {
		key := keyOf(obj)
		c, ok := w.compiled[key]
		if !ok {
			c = w.compile(obj)
		}
		next[key] = c
		out = append(out, c)
	}
	w.compiled = next
	slices.SortFunc(out, func(a, b *policy.Compiled) int { return strings.Compare(a.Name, b.Name) })
	for i := MaxPolicies; i < len(out); i++ {
		c := *out[i]
		c.Err = fmt.Errorf("more than %d issuance policies: the CA decides by the first %d in name order", MaxPolicies, MaxPolicies)
		out[i] = &c
	}
	w.current = out
	w.set.Store(policy.NewSet(out, policy.SetConfig{Labels: w.labels, Tally: w.tally, Observer: w.cfg.Observer, TTL: w.cfg.TTL}))
	names := make([]string, len(out))
	for i, c := range out {
		names[i] = c.Name
	}
	w.cfg.Observer.PoliciesInstalled(names, policy.AllDecisions())
}

// compile compiles a policy from the informer's store. One that cannot
// be read fails closed: it selects every request, and refuses it as
// unavailable.
func (w *Watcher) compile(obj any) *policy.Compiled {
	u, _ := obj.(*unstructured.Unstructured)
	if u == nil {
		return &policy.Compiled{Name: fmt.Sprintf("(a %T)", obj), Err: fmt.Errorf("unexpected %T in the store", obj)}
	}
	p, err := toPolicy(u)
	if err != nil {
		w.cfg.Logger.Warn("an IssuancePolicy cannot be read; it refuses every request", "policy", u.GetName(), "error", err)
		return &policy.Compiled{Name: u.GetName(), UID: string(u.GetUID()), Generation: u.GetGeneration(), Err: err}
	}
	c := w.cfg.Compiler.Compile(p)
	if c.Err != nil {
		w.cfg.Logger.Warn("an IssuancePolicy does not compile; it refuses what it selects", "policy", p.Name, "error", c.Err)
	}
	return c
}

// keyOf is a policy's uid and generation: what it is compiled once for.
func keyOf(obj any) string {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return fmt.Sprintf("%T", obj)
	}
	return fmt.Sprintf("%s/%d", u.GetUID(), u.GetGeneration())
}

// toPolicy reads an IssuancePolicy strictly: a field this CA does not
// know (a newer version's rule) is an error, not a rule ignored.
func toPolicy(u *unstructured.Unstructured) (*policy.IssuancePolicy, error) {
	p := &policy.IssuancePolicy{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, p, true); err != nil {
		return nil, fmt.Errorf("%s: %w", u.GetName(), err)
	}
	return p, nil
}
