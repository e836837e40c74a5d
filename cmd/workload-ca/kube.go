package main

import (
	"fmt"
	"net"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/workload-ca/workload-ca/internal/cli"
)

// kubeClients are the CA's Kubernetes clients, one per kind of work, each
// with a client-side rate limit of its own, as kube-controller-manager
// gives each controller and its leader election a client: a storm of
// TokenReviews must not hold a lease renewal past its deadline, nor a
// writer's sweep of every namespace hold the TokenReviews. Each names its
// work in its user agent, for the API server's audit log. They share
// connections (client-go shares one transport between configurations that
// differ only in rate limit and user agent), except leader election's,
// which has a connection of its own.
type kubeClients struct {
	// reviews makes the request path's TokenReviews, which the reviewer
	// paces itself (its client has no rate limit of its own); pods its pod
	// index (watch and live lookups), accounts the service account index.
	// Apart, a flood of never-seen tokens, each a TokenReview, cannot hold
	// up the pod lookups.
	reviews, pods, accounts kubernetes.Interface
	// leader renews the leader election Lease.
	leader kubernetes.Interface
	// The writers: the CA Secret, ClusterTrustBundles, root ConfigMaps,
	// PodCertificateRequests, istiod's certificate Secret.
	caState, bundles, rootConfigMaps, podCerts, istiodCert kubernetes.Interface
	// remoteSecrets watches the Secrets of remote clusters.
	remoteSecrets kubernetes.Interface
	// upstream writes the CertificateRequests of a cert-manager upstream.
	upstream dynamic.Interface
}

// Leader election's own rate limit, independent of --kube-api-qps: a
// renewal is a read and a write per retry period.
const (
	leaderQPS   = 5
	leaderBurst = 10
)

// newKubeClients builds the clients from a kubeconfig file, or in-cluster.
// Their rate limits are ours to set: client-go's default (5/s) would
// throttle TokenReviews during a cold-start storm.
func newKubeClients(cfg processOptions) (*kubeClients, error) {
	base, err := loadRESTConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubeClientsFor(base, float32(cfg.KubeQPS), cfg.KubeBurst)
}

// loadRESTConfig reads the kubeconfig file path, KUBECONFIG's, or the
// in-cluster configuration.
func loadRESTConfig(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	base, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, fmt.Errorf("%w: no Kubernetes configuration: not running in a cluster, and no --kubeconfig (or KUBECONFIG) given", cli.ErrUsage)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	base.UserAgent = "workload-ca/" + version
	return base, nil
}

// kubeClientsFor builds the clients from base, with qps and burst for each
// informer and writer; the TokenReviews are paced by the reviewer.
func kubeClientsFor(base *rest.Config, qps float32, burst int) (*kubeClients, error) {
	k := &kubeClients{}
	for _, c := range []struct {
		work   string
		client *kubernetes.Interface
		qps    float32
		burst  int
		// ownConn gives the client a connection of its own.
		ownConn bool
	}{
		{"tokenreview", &k.reviews, 0, 0, false},
		{"podindex", &k.pods, qps, burst, false},
		{"saindex", &k.accounts, qps, burst, false},
		{"leader-election", &k.leader, leaderQPS, leaderBurst, true},
		{"ca-state", &k.caState, qps, burst, false},
		{"trustbundle", &k.bundles, qps, burst, false},
		{"rootconfigmap", &k.rootConfigMaps, qps, burst, false},
		{"podcert", &k.podCerts, qps, burst, false},
		{"istiodcert", &k.istiodCert, qps, burst, false},
		{"remotesecrets", &k.remoteSecrets, qps, burst, false},
	} {
		cfg := rest.CopyConfig(base)
		cfg.UserAgent += " (" + c.work + ")"
		cfg.QPS, cfg.Burst, cfg.RateLimiter = c.qps, c.burst, nil
		if c.qps == 0 {
			cfg.RateLimiter = flowcontrol.NewFakeAlwaysRateLimiter()
		}
		if c.ownConn {
			// A dialer of its own keeps client-go from sharing the
			// transport (and so the HTTP/2 connection) of the others:
			// a renewal never waits behind a pod list's frames.
			cfg.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client for %s: %w", c.work, err)
		}
		*c.client = cs
	}
	cfg := rest.CopyConfig(base)
	cfg.UserAgent += " (upstream)"
	cfg.QPS, cfg.Burst, cfg.RateLimiter = qps, burst, nil
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for upstream: %w", err)
	}
	k.upstream = dyn
	return k, nil
}
