package cluster_test

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/workload-ca/workload-ca/authz/cluster"
	"github.com/workload-ca/workload-ca/internal/testlog"
)

func kubeconfig(host string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, host)
}

type readiness struct {
	mu      sync.Mutex
	last    map[string]bool
	refused map[string]int
}

func (r *readiness) RemoteKubeconfigRefused(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refused == nil {
		r.refused = map[string]int{}
	}
	r.refused[reason]++
}

func (r *readiness) refusals() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.refused)
}

func (r *readiness) RemoteClusters(ready map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = ready
}

func (r *readiness) get() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// TestRemotes: the sources configure the running clusters; a changed
// kubeconfig replaces its cluster, a removed one stops it, the local id and
// a second source of one id are refused, and each cluster is reported
// ready once indexed.
func TestRemotes(t *testing.T) {
	var mu sync.Mutex
	built := map[string]int{} // host → builds
	obs := &readiness{}
	r, err := cluster.NewRemotes(cluster.RemotesConfig{Local: "A", Observer: obs, Logger: testlog.New(t),
		Build: func(id string, cfg *rest.Config) (*cluster.Cluster, error) {
			mu.Lock()
			built[cfg.Host]++
			mu.Unlock()
			c := fake.NewClientset()
			return cluster.New(cluster.Config{ID: id, Clients: cluster.Clients{Reviews: c, Pods: c, Accounts: c},
				TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local")})
		}})
	if err != nil {
		t.Fatal(err)
	}
	r.Set("secret s1", cluster.Trusted, map[string][]byte{"B": kubeconfig("https://b1:6443"), "A": kubeconfig("https://a:6443"), "bad": []byte("{")})
	if _, ok := r.Cluster("B"); ok {
		t.Fatal("a cluster runs before Run")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor(t, "B ready", func() bool { return obs.get()["B"] })
	first, ok := r.Cluster("B")
	if !ok || first.Ready() != nil {
		t.Fatalf("B: %v, ready %v", ok, first.Ready())
	}
	for _, id := range []string{"A", "bad", "C"} {
		if _, ok := r.Cluster(id); ok {
			t.Errorf("cluster %q runs; the local id, a bad kubeconfig and an unconfigured id must not", id)
		}
	}

	r.Set("secret s2", cluster.Trusted, map[string][]byte{"B": kubeconfig("https://other:6443")})
	if c, _ := r.Cluster("B"); c != first {
		t.Error("a second source of B replaced the first")
	}
	r.Set("secret s1", cluster.Trusted, map[string][]byte{"B": kubeconfig("https://b2:6443")})
	second, ok := r.Cluster("B")
	if !ok || second == first {
		t.Fatal("a changed kubeconfig did not replace the cluster")
	}
	r.Set("secret s1", cluster.Trusted, map[string][]byte{"B": kubeconfig("https://b2:6443")})
	if c, _ := r.Cluster("B"); c != second {
		t.Error("the same kubeconfig again restarted the cluster")
	}
	r.Set("secret s1", cluster.Trusted, nil)
	if c, ok := r.Cluster("B"); !ok || c == second {
		t.Fatal("with s1 gone, B should come from s2")
	}
	r.Set("secret s2", cluster.Trusted, nil)
	if _, ok := r.Cluster("B"); ok {
		t.Fatal("B runs with no source")
	}
	if ids := r.IDs(); len(ids) != 0 {
		t.Errorf("IDs = %q", ids)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if built["https://b1:6443"] != 1 || built["https://b2:6443"] != 1 || built["https://other:6443"] != 1 || built["https://a:6443"] != 0 {
		t.Errorf("builds by host: %v", built)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("%s: not within 10s", what)
}
