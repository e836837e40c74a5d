package kubeclient

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// TestKubeClients checks that every kind of work gets a client with a rate
// limiter of its own, at --kube-api-qps except leader election's and the
// TokenReviews' (which the reviewer paces: its client has no limit), and
// names itself in its user agent.
func TestKubeClients(t *testing.T) {
	var mu sync.Mutex
	var agents []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		agents = append(agents, r.UserAgent())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"x"}}`))
	}))
	defer api.Close()
	k, err := For(&rest.Config{Host: api.URL, UserAgent: "workload-ca/test"}, 7, 9)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		work   string
		client kubernetes.Interface
		qps    float32 // 0: no limit
	}{
		{"tokenreview", k.Reviews, 0},
		{"podindex", k.Pods, 7},
		{"saindex", k.Accounts, 7},
		{"leader-election", k.Leader, leaderQPS},
		{"ca-state", k.CAState, 7},
		{"trustbundle", k.Bundles, 7},
		{"rootconfigmap", k.RootConfigMaps, 7},
		{"podcert", k.PodCerts, 7},
		{"istiodcert", k.IstiodCert, 7},
	}
	limiters := map[flowcontrol.RateLimiter]string{}
	for _, tt := range tests {
		t.Run(tt.work, func(t *testing.T) {
			l := tt.client.CoreV1().RESTClient().GetRateLimiter()
			if other, shared := limiters[l]; shared {
				t.Errorf("shares its rate limiter with %s", other)
			}
			limiters[l] = tt.work
			switch {
			case tt.qps == 0:
				for range 1000 {
					if !l.TryAccept() {
						t.Fatal("a request was held back")
					}
				}
			case l.QPS() != tt.qps:
				t.Errorf("QPS %v, want %v", l.QPS(), tt.qps)
			}
			// The limiter covers every API group of the client.
			if tt.client.CertificatesV1().RESTClient().GetRateLimiter() != l {
				t.Error("certificates.k8s.io has a limiter of its own")
			}
			mu.Lock()
			agents = agents[:0]
			mu.Unlock()
			if _, err := tt.client.CoreV1().Namespaces().Get(t.Context(), "x", metav1.GetOptions{}); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := "workload-ca/test (" + tt.work + ")"; len(agents) != 1 || agents[0] != want {
				t.Errorf("user agents %q, want %q", agents, want)
			}
		})
	}
}
