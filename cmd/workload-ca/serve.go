package main

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/workload-ca/workload-ca/authz/cluster"
	"github.com/workload-ca/workload-ca/authz/tokenreview"
	"github.com/workload-ca/workload-ca/ca/source"
	"github.com/workload-ca/workload-ca/internal/cli"
	"github.com/workload-ca/workload-ca/internal/cliflag"
	"github.com/workload-ca/workload-ca/istiodcert"
	"github.com/workload-ca/workload-ca/podcert"
	"github.com/workload-ca/workload-ca/policy/watch"
	"github.com/workload-ca/workload-ca/server"
	"github.com/workload-ca/workload-ca/trust/clustertrustbundle"
	"github.com/workload-ca/workload-ca/trust/configmap"
	"github.com/workload-ca/workload-ca/trust/federation"
)

// serveOptions are the option groups of `workload-ca serve`, one per
// feature: each defines its flags, validates them and builds what it
// adds. A new feature adds its group here, in AddFlags and in validate.
type serveOptions struct {
	process    processOptions
	serving    server.Options
	material   source.Options
	tokens     tokenreview.Options
	clusters   cluster.Options
	federation federation.Options
	bundles    clustertrustbundle.Options
	rootCMs    configmap.Options
	podCerts   podcert.Options
	istiod     istiodcert.Options
	policies   watch.Options
}

// serveSections are the sections of serve's flags, in the order the help
// and the configuration reference show them.
func serveSections() []string {
	return []string{"General", "Serving", "Identities and lifetimes", "CA material", "Rotation (with --ca-secret)",
		"Kubernetes API", "Authentication", "Multi-cluster (with --cluster-id)", "Federation", "Authorization",
		"Overload and connection limits", "Shutdown", "Trust distribution (leader only)",
		"istiod's serving certificate (leader only)", "Leader election", "Observability"}
}

// serveFlags defines the flags of `workload-ca serve`: the one list the
// parser, the help and the generated configuration reference read. Groups
// that share a section add their flags to it in the order they are called.
func serveFlags() (*pflag.FlagSet, *serveOptions) {
	fs := cliflag.New("serve")
	o := &serveOptions{}
	o.process.AddFlags(fs)
	o.serving.AddFlags(fs)
	o.material.AddFlags(fs)
	o.tokens.AddFlags(fs)
	o.clusters.AddFlags(fs)
	o.federation.AddFlags(fs)
	o.bundles.AddFlags(fs)
	o.rootCMs.AddFlags(fs)
	o.podCerts.AddFlags(fs)
	o.istiod.AddFlags(fs)
	o.policies.AddFlags(fs)
	return fs.Done(serveSections()...), o
}

// validate validates the parsed flags (environment variables
// WORKLOAD_CA_<FLAG> already applied), once, group by group, and reports
// every problem together, in about the order serve always reported them;
// a group that reads another's checked values comes after it.
func (o *serveOptions) validate() error {
	errs := []error{
		o.rootCMs.Validate(),
		o.material.Validate(),
		o.serving.Validate(),
		o.process.Validate(),
		o.istiod.Validate(),
		o.podCerts.Validate(o.material.MaxTTL),
		o.clusters.Validate(o.process.Leader.Namespace),
		o.federation.Validate(o.material.TrustDomain, o.bundles.Publish, o.rootCMs.Publish),
		o.tokens.Validate(),
		o.policies.Validate(),
	}
	o.serving.SetSignsDefault(o.material.SignsRemotely())
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("%w: %w", cli.ErrUsage, errors.Join(errs...))
		}
	}
	return nil
}

// serveCommand is `workload-ca serve`.
func serveCommand() cli.Command[serveOptions] {
	return cli.Command[serveOptions]{
		Use:   "serve",
		Short: "Run the CA (gRPC IstioCertificateService)",
		Long: `Runs the CA: the gRPC IstioCertificateService for ztunnel and istio-agent on
--listen-addr, metrics and health on --admin-addr, and, on the leader, the
trust distribution and rotation tasks. Exactly one of --ca-dir and
--ca-secret names the CA material; serve --validate checks it and exits.`,
		Flags: func() (*pflag.FlagSet, func([]string) (serveOptions, error)) {
			fs, o := serveFlags()
			return fs, func([]string) (serveOptions, error) {
				// validate fills in what it checked: copy o after it.
				err := o.validate()
				return *o, err
			}
		},
		Exclusive: [][]string{{"ca-dir", "ca-secret"}, {"ca-dir", "ca-root-dir"}},
		OneOf:     [][]string{{"ca-dir", "ca-secret"}},
		Values: map[string][]string{
			"ca-key-type":        {"ecdsa-p256", "ecdsa-p384", "rsa-2048", "rsa-3072", "rsa-4096"},
			"tls-min-version":    {"1.3", "1.2"},
			"token-verification": {"local", "tokenreview"},
			"log-level":          {"debug", "info", "warn", "error"},
			"log-format":         {"json", "text"},
		},
		Dirs:  []string{"ca-dir", "ca-root-dir"},
		Files: []string{"kubeconfig", "audit-log", "federation-config", "ca-upstream-config"},
		Run:   runServe,
	}
}
