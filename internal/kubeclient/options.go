package kubeclient

import (
	"errors"

	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// Options are the flags of the Kubernetes API clients.
type Options struct {
	Kubeconfig string
	QPS        float64
	Burst      int
}

// AddFlags defines the flags in the section Kubernetes API.
func (o *Options) AddFlags(fs *cliflag.FlagSet) {
	fs.Section("Kubernetes API")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file; in-cluster configuration when empty")
	fs.Float64Var(&o.QPS, "kube-api-qps", 50, "sustained rate of Kubernetes API requests of each client: the TokenReviews, the pod index and each writer have a rate limit of their own, leader election a fixed one")
	fs.IntVar(&o.Burst, "kube-api-burst", 100, "burst of Kubernetes API requests of each client")
	fs.Example("kubeconfig", "$HOME/.kube/config")
}

// Validate checks the rate limits.
func (o *Options) Validate() error {
	if o.QPS <= 0 || o.Burst <= 0 {
		return errors.New("--kube-api-qps and --kube-api-burst must be positive")
	}
	return nil
}

// Clients builds the clients from --kubeconfig, or in-cluster; they name
// themselves userAgent. Their rate limits are ours to set: client-go's
// default (5/s) would throttle TokenReviews during a cold-start storm.
func (o *Options) Clients(userAgent string) (*Clients, error) {
	base, err := LoadConfig(o.Kubeconfig, userAgent)
	if err != nil {
		return nil, err
	}
	return For(base, float32(o.QPS), o.Burst)
}
