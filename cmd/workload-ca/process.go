package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/workload-ca/workload-ca/internal/cli"
	"github.com/workload-ca/workload-ca/internal/cliflag"
	"github.com/workload-ca/workload-ca/internal/kubeclient"
	"github.com/workload-ca/workload-ca/internal/leader"
)

// processOptions are the flags of the process itself rather than of a
// feature: --validate, its Kubernetes API clients, leader election, and
// its logs, metrics and admin endpoint.
type processOptions struct {
	// Validate checks the configuration and the CA material, prints what
	// would run and exits (--validate).
	ValidateOnly bool
	Kube         kubeclient.Options
	Leader       leader.Options
	AdminAddr    string
	LogLevel     slog.Level
	logLevel     string
	// LogText writes the logs as text (--log-format text) instead of JSON.
	LogText      bool
	logFormat    string
	AuditLog     string
	IstioMetrics bool
	Pprof        bool
}

// AddFlags defines the flags in the sections General, Kubernetes API,
// Leader election and Observability.
func (o *processOptions) AddFlags(fs *cliflag.FlagSet) {
	fs.Section("General")
	fs.BoolVar(&o.ValidateOnly, "validate", false, "check the flags and the CA material that needs no API server (a directory, a plug-in root, a KMS or HSM key), print what would run, and exit without writing anything")
	o.Kube.AddFlags(fs)
	o.Leader.AddFlags(fs)
	fs.Section("Observability")
	fs.StringVar(&o.AdminAddr, "admin-addr", ":15014", "HTTP address of /metrics, /healthz and /readyz")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&o.logFormat, "log-format", "json", "log format: json (one object a line, for log pipelines) or text (key=value, for a terminal); audit records in --audit-log are always JSON")
	fs.StringVar(&o.AuditLog, "audit-log", "", "file for the audit records (one per decision); empty: with the other logs on stdout")
	fs.BoolVar(&o.IstioMetrics, "istio-metrics-compat", false, "also export istiod's citadel_server_* metrics")
	fs.BoolVar(&o.Pprof, "pprof", false, "serve /debug/pprof on the admin address")
	fs.Example("audit-log", "/var/log/workload-ca/audit.log")
}

// Validate checks the flags, every problem reported.
func (o *processOptions) Validate() error {
	var errs []error
	switch o.logFormat {
	case "json":
	case "text":
		o.LogText = true
	default:
		errs = append(errs, fmt.Errorf("--log-format %q: want json or text", o.logFormat))
	}
	if err := o.LogLevel.UnmarshalText([]byte(o.logLevel)); err != nil {
		errs = append(errs, fmt.Errorf("--log-level: %w", err))
	}
	return errors.Join(append(errs, o.Kube.Validate(), o.Leader.Validate())...)
}

// logger is the process's logger, on stdout; client-go logs through
// klog, routed into it. Its verbosity stays at the default, which never
// logs bearer tokens.
func (o *processOptions) logger(stdout io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: o.LogLevel}
	var h slog.Handler = slog.NewJSONHandler(stdout, opts)
	if o.LogText {
		h = slog.NewTextHandler(stdout, opts)
	}
	log := slog.New(h)
	klog.SetSlogLogger(log.With("component", "client-go"))
	return log
}

// auditLogger writes audit records to their own file, or with the other
// logs (marked "log":"audit") when --audit-log is empty.
func (o *processOptions) auditLogger(log *slog.Logger) (*slog.Logger, func(), error) {
	if o.AuditLog == "" {
		return log.With("log", "audit"), func() {}, nil
	}
	f, err := os.OpenFile(filepath.Clean(o.AuditLog), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("--audit-log: %w", err)
	}
	return slog.New(slog.NewJSONHandler(f, nil)).With("log", "audit"), func() { _ = f.Close() }, nil
}

// newKubeClients builds the process's Kubernetes clients; no
// configuration at all is a usage error.
func newKubeClients(o kubeclient.Options) (*kubeclient.Clients, error) {
	k, err := o.Clients("workload-ca/" + version)
	return k, usageIfNoConfig(err)
}

// loadKubeConfig reads the kubeconfig file path, KUBECONFIG's, or the
// in-cluster configuration; none at all is a usage error.
func loadKubeConfig(path string) (*rest.Config, error) {
	cfg, err := kubeclient.LoadConfig(path, "workload-ca/"+version)
	return cfg, usageIfNoConfig(err)
}

func usageIfNoConfig(err error) error {
	if errors.Is(err, kubeclient.ErrNoConfig) {
		return fmt.Errorf("%w: %w", cli.ErrUsage, err)
	}
	return err
}
