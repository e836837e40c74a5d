package kubeclient

import (
	"errors"
	"fmt"
	"net"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"
)

// Clients are the CA's Kubernetes clients, one per kind of work, each
// with a client-side rate limit of its own, as kube-controller-manager
// gives each controller and its leader election a client: a storm of
// TokenReviews must not hold a lease renewal past its deadline, nor a
// writer's sweep of every namespace hold the TokenReviews. Each names its
// work in its user agent, for the API server's audit log. They share
// connections (client-go shares one transport between configurations that
// differ only in rate limit and user agent), except leader election's,
// which has a connection of its own.
type Clients struct {
	// Reviews makes the request path's TokenReviews, which the reviewer
	// paces itself (its client has no rate limit of its own); Pods its pod
	// index (watch and live lookups), Accounts the service account index.
	// Apart, a flood of never-seen tokens, each a TokenReview, cannot hold
	// up the pod lookups.
	Reviews, Pods, Accounts kubernetes.Interface
	// Leader renews the leader election Lease.
	Leader kubernetes.Interface
	// The writers: the CA Secret, ClusterTrustBundles, root ConfigMaps,
	// PodCertificateRequests, istiod's certificate Secret.
	CAState, Bundles, RootConfigMaps, PodCerts, IstiodCert kubernetes.Interface
	// RemoteSecrets watches the Secrets of remote clusters.
	RemoteSecrets kubernetes.Interface
	// Upstream writes the CertificateRequests of a cert-manager upstream.
	Upstream dynamic.Interface
	// Policies reads the IssuancePolicies and writes their status; Labels
	// lists the namespaces' and nodes' labels for them; PolicyChecks
	// checks the permissions they need.
	Policies     dynamic.Interface
	Labels       metadata.Interface
	PolicyChecks kubernetes.Interface
}

// Leader election's own rate limit, independent of --kube-api-qps: a
// renewal is a read and a write per retry period.
const (
	leaderQPS   = 5
	leaderBurst = 10
)

// ErrNoConfig is returned when there is no configuration to load.
var ErrNoConfig = errors.New("no Kubernetes configuration: not running in a cluster, and no --kubeconfig (or KUBECONFIG) given")

// LoadConfig reads the kubeconfig file path, KUBECONFIG's, or the
// in-cluster configuration; its clients name themselves userAgent.
func LoadConfig(path, userAgent string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	base, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, ErrNoConfig
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	base.UserAgent = userAgent
	return base, nil
}

// For builds the clients from base, with qps and burst for each informer
// and writer; the TokenReviews are paced by the reviewer.
func For(base *rest.Config, qps float32, burst int) (*Clients, error) {
	k := &Clients{}
	for _, c := range []struct {
		work   string
		client *kubernetes.Interface
		qps    float32
		burst  int
		// ownConn gives the client a connection of its own.
		ownConn bool
	}{
		{"tokenreview", &k.Reviews, 0, 0, false},
		{"podindex", &k.Pods, qps, burst, false},
		{"saindex", &k.Accounts, qps, burst, false},
		{"leader-election", &k.Leader, leaderQPS, leaderBurst, true},
		{"ca-state", &k.CAState, qps, burst, false},
		{"trustbundle", &k.Bundles, qps, burst, false},
		{"rootconfigmap", &k.RootConfigMaps, qps, burst, false},
		{"podcert", &k.PodCerts, qps, burst, false},
		{"istiodcert", &k.IstiodCert, qps, burst, false},
		{"remotesecrets", &k.RemoteSecrets, qps, burst, false},
		{"policy", &k.PolicyChecks, qps, burst, false},
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
	k.Upstream = dyn
	cfg = rest.CopyConfig(base)
	cfg.UserAgent += " (policy)"
	cfg.QPS, cfg.Burst, cfg.RateLimiter = qps, burst, nil
	if k.Policies, err = dynamic.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("kubernetes client for policy: %w", err)
	}
	if k.Labels, err = metadata.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("kubernetes client for policy: %w", err)
	}
	return k, nil
}
