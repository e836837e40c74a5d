package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/workload-ca/workload-ca/e2e/internal/proc"
)

// EnvBinDir names the environment variable that gives the default BinDir.
const EnvBinDir = "WORKLOAD_CA_CONTROLPLANE_BIN"

// Options configures Start. The zero value is usable when EnvBinDir is set.
type Options struct {
	// BinDir holds the etcd and kube-apiserver binaries. Default: $EnvBinDir.
	BinDir string
	// WorkDir receives certificates, the kubeconfig, etcd's data, server
	// logs, the audit log and TMPDIR scratch. Default: a new temporary
	// directory, removed by Stop (unless KeepWorkDir). A given WorkDir is
	// never removed.
	WorkDir string
	// KeepWorkDir keeps a temporary WorkDir after Stop, for inspection.
	KeepWorkDir bool
	// ExtraAPIServerFlags are added to (and override) the kube-apiserver
	// flags, keyed by flag name with or without the leading "--".
	ExtraAPIServerFlags map[string]string
	// AuditPolicy replaces the default audit policy (YAML), which logs only
	// TokenReviews at Metadata level.
	AuditPolicy string
	// Stdout and Stderr receive both servers' output. Default: the files
	// etcd.log and kube-apiserver.log in WorkDir. If only one is set, it
	// is used for both. They are written from several goroutines, so they
	// must be safe for concurrent use.
	Stdout, Stderr io.Writer
	// ReadyTimeout bounds the wait for the apiserver's /readyz. Default 60s.
	ReadyTimeout time.Duration
}

// Timings records how long start-up took.
type Timings struct {
	EtcdHealthy    time.Duration // from starting etcd to a healthy /health
	APIServerReady time.Duration // from starting kube-apiserver to /readyz ok
}

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	opts        Options
	workDir     string
	ownsWorkDir bool
	pki         *pki
	logFiles    []*os.File

	// mu guards apiserver, which StopAPIServer and StartAPIServer
	// replace.
	mu              sync.Mutex
	etcd, apiserver *proc.Process
	etcdURL         string
	apiPort         int
	host            string
	restConfig      *rest.Config
	client          kubernetes.Interface
	kubeconfig      string
	auditLog        string
	timings         Timings

	stopOnce sync.Once
	stopErr  error
}

// Start starts etcd and kube-apiserver and waits until the apiserver is
// ready. ctx bounds start-up only; the servers run until Stop. On error nothing is left running and the work dir is kept; the
// error names it.
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	c := &ControlPlane{opts: opts}
	if err := c.prepare(); err != nil {
		c.cleanupFailed()
		return nil, err
	}
	if err := c.startServers(ctx); err != nil {
		c.cleanupFailed()
		return nil, fmt.Errorf("controlplane (work dir %s): %w", c.workDir, err)
	}
	if err := c.writeKubeconfig(); err != nil {
		c.cleanupFailed()
		return nil, err
	}
	return c, nil
}

// prepare applies defaults, checks binaries and writes the PKI and policy.
func (c *ControlPlane) prepare() error {
	if c.opts.BinDir == "" {
		c.opts.BinDir = os.Getenv(EnvBinDir)
	}
	if c.opts.BinDir == "" {
		return fmt.Errorf("controlplane: no BinDir and %s is unset", EnvBinDir)
	}
	for _, name := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(c.opts.BinDir, name)); err != nil {
			return fmt.Errorf("controlplane: %w", err)
		}
	}
	if c.opts.ReadyTimeout == 0 {
		c.opts.ReadyTimeout = 60 * time.Second
	}
	if err := c.makeWorkDir(); err != nil {
		return err
	}
	var err error
	if c.pki, err = newPKI(filepath.Join(c.workDir, "pki")); err != nil {
		return err
	}
	return c.writeAuditPolicy()
}

func (c *ControlPlane) makeWorkDir() error {
	c.workDir = c.opts.WorkDir
	if c.workDir == "" {
		dir, err := os.MkdirTemp("", "workload-ca-controlplane-")
		if err != nil {
			return fmt.Errorf("controlplane: %w", err)
		}
		c.workDir, c.ownsWorkDir = dir, true
	}
	if err := os.MkdirAll(filepath.Join(c.workDir, "tmp"), 0o700); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	return nil
}

// startServers starts etcd, then the apiserver, retrying with new ports if
// one was taken between picking it and binding it.
func (c *ControlPlane) startServers(ctx context.Context) error {
	if err := proc.RetryPorts(func() error { return c.startEtcd(ctx) }); err != nil {
		return err
	}
	return proc.RetryPorts(func() error { return c.startAPIServer(ctx) })
}

// logWriters returns the writers for a server's output.
func (c *ControlPlane) logWriters(name string) (stdout, stderr io.Writer, err error) {
	stdout, stderr = c.opts.Stdout, c.opts.Stderr
	switch {
	case stdout == nil && stderr == nil:
		f, err := os.OpenFile(filepath.Join(c.workDir, name+".log"),
			os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, nil, err
		}
		c.logFiles = append(c.logFiles, f)
		return f, f, nil
	case stdout == nil:
		stdout = stderr
	case stderr == nil:
		stderr = stdout
	}
	return stdout, stderr, nil
}

// Stop kills both servers, waits for them to exit and removes a temporary
// work dir. It is safe to call more than once.
func (c *ControlPlane) Stop() error {
	c.stopOnce.Do(func() {
		c.stopErr = c.killAll()
		if c.stopErr == nil && c.ownsWorkDir && !c.opts.KeepWorkDir {
			c.stopErr = os.RemoveAll(c.workDir)
		}
	})
	return c.stopErr
}

// killAll kills the apiserver and etcd and closes the log files.
func (c *ControlPlane) killAll() error {
	c.mu.Lock()
	apiserver := c.apiserver
	c.mu.Unlock()
	err := errors.Join(apiserver.Kill(10*time.Second), c.etcd.Kill(10*time.Second))
	for _, f := range c.logFiles {
		err = errors.Join(err, f.Close())
	}
	c.logFiles = nil
	return err
}

// cleanupFailed stops what a failed Start left running, keeping the work dir.
func (c *ControlPlane) cleanupFailed() { _ = c.killAll() }

// RESTConfig returns a new admin config (client certificate in group
// system:masters).
func (c *ControlPlane) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// Client returns an admin clientset.
func (c *ControlPlane) Client() kubernetes.Interface { return c.client }

// ImpersonatedConfig returns an admin config that impersonates user with
// groups. For a service account username (system:serviceaccount:<ns>:<sa>)
// without groups the apiserver adds the service-account groups itself.
func (c *ControlPlane) ImpersonatedConfig(user string, groups ...string) *rest.Config {
	cfg := c.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cfg
}

// NodeConfig returns a config acting as the kubelet of node.
func (c *ControlPlane) NodeConfig(node string) *rest.Config {
	return c.ImpersonatedConfig("system:node:"+node, "system:nodes")
}

// ServiceAccountConfig returns a config acting as service account ns/name.
func (c *ControlPlane) ServiceAccountConfig(ns, name string) *rest.Config {
	return c.ImpersonatedConfig("system:serviceaccount:" + ns + ":" + name)
}

// Host returns the apiserver URL, https://127.0.0.1:<port>.
func (c *ControlPlane) Host() string { return c.host }

// CAFile returns the path of the PEM CA that signed the serving and client
// certificates.
func (c *ControlPlane) CAFile() string { return c.pki.caFile }

// KubeconfigPath returns the admin kubeconfig written into the work dir.
func (c *ControlPlane) KubeconfigPath() string { return c.kubeconfig }

// WorkDir returns the work directory.
func (c *ControlPlane) WorkDir() string { return c.workDir }

// Timings returns how long start-up took.
func (c *ControlPlane) Timings() Timings { return c.timings }

// PIDs returns the process ids of etcd and kube-apiserver.
func (c *ControlPlane) PIDs() (etcd, apiserver int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.etcd.Pid(), c.apiserver.Pid()
}
