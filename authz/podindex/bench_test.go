package podindex

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// cluster generates a realistic large cluster: per node a few DaemonSet pods
// (ztunnel, kube-proxy, node exporter, log shipper), the rest spread over
// ~500 namespaces with 1-5 service accounts each.
type cluster struct {
	nodes, namespaces, pods int
	rng                     *rand.Rand
	daemonSets              []saName
}

func newCluster(pods, nodes, namespaces int) *cluster {
	return &cluster{
		nodes: nodes, namespaces: namespaces, pods: pods,
		rng: rand.New(rand.NewPCG(1, 2)),
		daemonSets: []saName{
			{"istio-system", "ztunnel"}, {"kube-system", "kube-proxy"},
			{"monitoring", "node-exporter"}, {"logging", "fluent-bit"},
		},
	}
}

func (c *cluster) nodeName(i int) string {
	return fmt.Sprintf("ip-10-%d-%d-%d.eu-west-1.compute.internal", i/65536%256, i/256%256, i%256)
}

func (c *cluster) uuid() string {
	var b [16]byte
	for i := range b {
		b[i] = byte(c.rng.Uint32())
	}
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// pod returns the i-th pod; each call allocates a fresh object like a decoder.
func (c *cluster) pod(i int) *corev1.Pod {
	node := c.nodeName(i % c.nodes)
	ns, sa := "", ""
	if d := i / c.nodes; d < len(c.daemonSets) {
		ns, sa = c.daemonSets[d].namespace, c.daemonSets[d].name
	} else {
		n := c.rng.IntN(c.namespaces)
		ns = fmt.Sprintf("team-%03d-payments", n)
		sa = fmt.Sprintf("svc-%d-api", c.rng.IntN(1+n%5))
		node = c.nodeName(c.rng.IntN(c.nodes))
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s-7d9f8c6b5d-%05d", sa, i),
			Namespace: ns,
			UID:       types.UID(c.uuid()),
		},
		Spec:   corev1.PodSpec{NodeName: node, ServiceAccountName: sa},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkIndexMemory loads 150,000 pods over 5,000 nodes into the store,
// one watch event at a time and as one relist, and reports the heap the
// index keeps per pod.
func BenchmarkIndexMemory(b *testing.B) {
	const pods, nodes, namespaces = 150_000, 5_000, 500
	load := map[string]func(*store, *cluster) error{
		"events": func(s *store, c *cluster) error {
			for i := range pods {
				if err := s.Add(c.pod(i)); err != nil {
					return err
				}
			}
			return nil
		},
		"relist": func(s *store, c *cluster) error {
			list := make([]any, pods)
			for i := range list {
				list[i] = refOf(c.pod(i))
			}
			return s.Replace(list, "1")
		},
	}
	for _, name := range []string{"events", "relist"} {
		b.Run(name, func(b *testing.B) {
			var perPod float64
			for b.Loop() {
				c := newCluster(pods, nodes, namespaces)
				before := heapAlloc()
				s := newStore(slog.New(slog.DiscardHandler))
				if err := load[name](s, c); err != nil {
					b.Fatal(err)
				}
				after := heapAlloc()
				runtime.KeepAlive(s)
				st := s.stats()
				if st.Pods != pods {
					b.Fatalf("indexed %d pods, want %d", st.Pods, pods)
				}
				perPod = float64(after-before) / pods
				b.ReportMetric(float64(st.Nodes), "nodes")
				b.ReportMetric(float64(st.ServiceAccounts), "service-accounts")
				b.ReportMetric(float64(pairs(s.st)), "node-sa-pairs")
			}
			b.ReportMetric(perPod, "heap-bytes/pod")
		})
	}
}

// BenchmarkInitialListPeak reports what the reflector holds per pod while
// the initial watch-list streams in: its temporary store, with the store's
// transform applied (as client-go does for a TransformingStore). The full
// pods are garbage as soon as each is transformed.
func BenchmarkInitialListPeak(b *testing.B) {
	const pods = 150_000
	var perPod float64
	for b.Loop() {
		c := newCluster(pods, 5_000, 500)
		before := heapAlloc()
		tmp := cache.NewStore(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.WithTransformer(compact))
		for i := range pods {
			p := c.pod(i)
			p.ResourceVersion = "123456789"
			if err := tmp.Add(p); err != nil {
				b.Fatal(err)
			}
		}
		after := heapAlloc()
		runtime.KeepAlive(tmp)
		perPod = float64(after-before) / pods
	}
	b.ReportMetric(perPod, "heap-bytes/pod")
}

// loadedIndex is an Index holding 150,000 pods, and the last pod added.
func loadedIndex(b *testing.B) (*Index, *corev1.Pod) {
	b.Helper()
	idx := New(Config{Client: fake.NewClientset(), Logger: slog.New(slog.DiscardHandler)})
	c := newCluster(150_000, 5_000, 500)
	var last *corev1.Pod
	for i := range c.pods {
		last = c.pod(i)
		if err := idx.store.Add(last); err != nil {
			b.Fatal(err)
		}
	}
	return idx, last
}

// BenchmarkServiceAccountOnNodeHit measures the read path on a full index,
// from parallel callers.
func BenchmarkServiceAccountOnNodeHit(b *testing.B) {
	idx, last := loadedIndex(b)
	ctx := context.Background()
	node, ns, sa := last.Spec.NodeName, last.Namespace, last.Spec.ServiceAccountName
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if ok, err := idx.ServiceAccountOnNode(ctx, node, ns, sa); !ok || err != nil {
				b.Error("miss")
				return
			}
		}
	})
}

// BenchmarkPodHit measures Pod on a full index.
func BenchmarkPodHit(b *testing.B) {
	idx, last := loadedIndex(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, ok, err := idx.Pod(ctx, last.Namespace, last.Name, string(last.UID)); !ok || err != nil {
			b.Fatal("miss")
		}
	}
}

func pairs(st *state) int {
	n := 0
	for _, l := range st.onNode {
		n += len(l)
	}
	return n
}
