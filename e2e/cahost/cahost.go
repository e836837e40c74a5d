package cahost

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/e2e/internal/proc"
	"github.com/workload-ca/workload-ca/proto/capb"
)

// EnvBinary names the environment variable that gives the default Binary.
const EnvBinary = "WORKLOAD_CA_BINARY"

// MissingEnv returns the first unset variable of the two that tests running
// the built binary against a real control plane need (`make e2e` sets
// both), or "" when both are set.
func MissingEnv() string {
	for _, v := range []string{controlplane.EnvBinDir, EnvBinary} {
		if os.Getenv(v) == "" {
			return v
		}
	}
	return ""
}

// ServerName is the DNS name of the CA's serving certificate, which clients
// verify (the CA listens on 127.0.0.1).
const ServerName = "localhost"

// Options configures Start.
type Options struct {
	// Binary is the workload-ca executable. Default: $WORKLOAD_CA_BINARY.
	Binary string
	// Kubeconfig gives the CA its Kubernetes API access (required).
	Kubeconfig string
	// WorkDir receives the CA directory (ca/), the log (workload-ca.log)
	// and token files of Request. Default: a new temporary directory,
	// removed by Stop unless KeepWorkDir. A given WorkDir is never removed.
	WorkDir string
	// KeepWorkDir keeps a temporary WorkDir after Stop.
	KeepWorkDir bool
	// ExtraArgs are appended to the serve command line (later flags win).
	ExtraArgs []string
	// Env is added to the CA's environment (KEY=value).
	Env []string
	// CPUs, if set, are the only CPUs the CA runs on (Linux).
	CPUs []int
	// Log, if set, also receives the CA's output (JSON log lines).
	Log io.Writer
	// ReadyTimeout bounds the wait for SERVING. Default 30s.
	ReadyTimeout time.Duration
	// Roots, if set, returns the PEM roots that verify the CA's serving
	// certificate. It may fail until the CA has created its roots; Start
	// keeps polling. Default: <CADir>/root-cert.pem with --ca-dir (the
	// CA writes it there); with --ca-secret ns/name in ExtraArgs, the
	// Secret's root-cert.pem, read with Kubeconfig; with --ca-root-dir
	// too (the Secret then holds intermediates and no bundle), that
	// directory's root-cert.pem, or ca.crt.
	Roots func(ctx context.Context) ([]byte, error)
}

// CA is a running `workload-ca serve`.
type CA struct {
	opts        Options
	workDir     string
	ownsWorkDir bool
	addr        string
	logFile     *os.File
	adminAddr   string
	proc        *proc.Process
	startup     time.Duration

	stopOnce sync.Once
	stopErr  error
}

// AdminAddr is the address of /metrics, /healthz and /readyz.
func (c *CA) AdminAddr() string { return c.adminAddr }

// Start starts the CA and waits until its health service reports SERVING.
// ctx bounds start-up only. On error nothing is left running.
//
// The CA binds port 0 for both listeners and Start learns the ports from
// its "serving" log line, so concurrent starts never race for a port and
// a health check never reaches another CA that happens to share the root.
func Start(ctx context.Context, opts Options) (*CA, error) {
	c := &CA{opts: opts}
	if err := c.prepare(); err != nil {
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		_ = c.proc.Kill(10 * time.Second) // nil-safe: start may fail before exec
		_ = c.logFile.Close()
		return nil, fmt.Errorf("workload-ca (work dir %s): %w", c.workDir, err)
	}
	return c, nil
}

// prepare applies defaults and creates the work dir and the log file.
func (c *CA) prepare() error {
	if c.opts.Binary == "" {
		c.opts.Binary = os.Getenv(EnvBinary)
	}
	if c.opts.Binary == "" {
		return fmt.Errorf("cahost: no Binary and %s is unset (make build writes bin/workload-ca)", EnvBinary)
	}
	if _, err := os.Stat(c.opts.Binary); err != nil {
		return fmt.Errorf("cahost: %w", err)
	}
	if c.opts.Kubeconfig == "" {
		return errors.New("cahost: Kubeconfig is required")
	}
	if c.opts.ReadyTimeout == 0 {
		c.opts.ReadyTimeout = 30 * time.Second
	}
	c.workDir = c.opts.WorkDir
	if c.workDir == "" {
		dir, err := os.MkdirTemp("", "workload-ca-host-")
		if err != nil {
			return fmt.Errorf("cahost: %w", err)
		}
		c.workDir, c.ownsWorkDir = dir, true
	}
	for _, dir := range []string{c.CADir(), c.tokenDir()} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("cahost: %w", err)
		}
	}
	if err := c.defaultRoots(); err != nil {
		return err
	}
	var err error
	c.logFile, err = os.OpenFile(c.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("cahost: %w", err)
	}
	return nil
}

// defaultRoots sets Options.Roots when the CA's source is not --ca-dir.
func (c *CA) defaultRoots() error {
	ref, secretMode := flagValue(c.opts.ExtraArgs, "ca-secret")
	rootDir, rootDirMode := flagValue(c.opts.ExtraArgs, "ca-root-dir")
	switch {
	case c.opts.Roots != nil || !secretMode:
	case rootDirMode:
		c.opts.Roots = func(context.Context) ([]byte, error) {
			b, err := os.ReadFile(filepath.Join(rootDir, "root-cert.pem"))
			if errors.Is(err, fs.ErrNotExist) {
				return os.ReadFile(filepath.Join(rootDir, "ca.crt"))
			}
			return b, err
		}
	default:
		roots, err := SecretRoots(c.opts.Kubeconfig, ref)
		if err != nil {
			return err
		}
		c.opts.Roots = roots
	}
	return nil
}

// flagValue returns the value of --name in args ("--name v" or
// "--name=v"); the last one wins, as in the flag package.
func flagValue(args []string, name string) (string, bool) {
	var v string
	var found bool
	for i, a := range args {
		switch {
		case a == "--"+name && i+1 < len(args):
			v, found = args[i+1], true
		case strings.HasPrefix(a, "--"+name+"="):
			v, found = strings.TrimPrefix(a, "--"+name+"="), true
		}
	}
	return v, found
}

// SecretRoots returns an Options.Roots that reads the root bundle
// (root-cert.pem) of the --ca-secret Secret ref ("namespace/name") with
// the credentials of kubeconfig.
func SecretRoots(kubeconfig, ref string) (func(ctx context.Context) ([]byte, error), error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" {
		return nil, fmt.Errorf("cahost: --ca-secret %q: want namespace/name", ref)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("cahost: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("cahost: %w", err)
	}
	return func(ctx context.Context) ([]byte, error) {
		sec, err := client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		pemBytes := sec.Data[castate.KeyRootCert]
		if len(pemBytes) == 0 {
			return nil, fmt.Errorf("the Secret %s has no %s", ref, castate.KeyRootCert)
		}
		return pemBytes, nil
	}, nil
}

// start runs the binary on ports the kernel picks and waits until it
// serves.
func (c *CA) start(ctx context.Context) error {
	logStart, err := c.logFile.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("cahost: %w", err)
	}
	args := []string{"serve",
		"--listen-addr", "127.0.0.1:0",
		"--admin-addr", "127.0.0.1:0",
		"--kubeconfig", c.opts.Kubeconfig,
		"--serving-dns-names", ServerName,
		"--log-level", "debug",
		// Nothing routes to a local CA: no reason to keep serving after
		// SIGTERM before draining.
		"--shutdown-delay", "0s",
	}
	if _, ok := flagValue(c.opts.ExtraArgs, "ca-secret"); !ok {
		args = append(args, "--ca-dir", c.CADir())
	}
	args = append(args, c.opts.ExtraArgs...)
	var out io.Writer = c.logFile
	if c.opts.Log != nil {
		out = io.MultiWriter(c.logFile, c.opts.Log)
	}
	began := time.Now()
	if c.proc, err = proc.Start("workload-ca", c.opts.Binary, args, append(ChildEnv(), c.opts.Env...), out, out,
		proc.OnCPUs(c.opts.CPUs...)); err != nil {
		return err
	}
	if err := c.waitServing(ctx, logStart); err != nil {
		return err
	}
	c.startup = time.Since(began)
	return nil
}

// waitServing polls every 50ms, first the log (from offset logStart) for
// the "serving" line that names the bound addresses, then the health
// service until it reports SERVING; it gives up when the CA exits or
// ReadyTimeout or ctx ends.
func (c *CA) waitServing(ctx context.Context, logStart int64) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.ReadyTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := c.learnAddrs(logStart)
		if err == nil {
			err = c.healthy(ctx)
		}
		if err == nil {
			return nil
		}
		select {
		case <-c.proc.Done():
			_ = c.proc.Kill(time.Second) // reap done; nothing left to kill
			return c.proc.StartupError()
		case <-ctx.Done():
			_ = c.proc.Kill(10 * time.Second)
			return fmt.Errorf("workload-ca not SERVING after %v: %w; last output:\n%s", c.opts.ReadyTimeout, err, c.proc.Tail())
		case <-tick.C:
		}
	}
}

// learnAddrs sets Addr and AdminAddr from the CA's "serving" log line,
// written once both listeners are bound.
func (c *CA) learnAddrs(logStart int64) error {
	if c.addr != "" {
		return nil
	}
	f, err := os.Open(c.LogPath())
	if err != nil {
		return fmt.Errorf("cahost: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(logStart, io.SeekStart); err != nil {
		return fmt.Errorf("cahost: %w", err)
	}
	addr, admin, err := servingAddrs(f)
	if err != nil {
		return err
	}
	c.addr, c.adminAddr = addr, admin
	return nil
}

// servingAddrs finds the first "serving" line of a JSON log and returns
// its addr and admin_addr.
func servingAddrs(log io.Reader) (addr, adminAddr string, err error) {
	sc := bufio.NewScanner(log)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg       string `json:"msg"`
			Addr      string `json:"addr"`
			AdminAddr string `json:"admin_addr"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Msg != "serving" {
			continue
		}
		if line.Addr == "" || line.AdminAddr == "" {
			return "", "", fmt.Errorf("cahost: serving line without addresses: %s", sc.Bytes())
		}
		return line.Addr, line.AdminAddr, nil
	}
	if err := sc.Err(); err != nil {
		return "", "", fmt.Errorf("cahost: reading the log: %w", err)
	}
	return "", "", errors.New("cahost: the CA has not logged \"serving\" yet")
}

// healthy asks the health service for the certificate service's status
// over a fresh connection (a failed connection would otherwise sit in
// gRPC's reconnect backoff and skew the measured start-up time).
func (c *CA) healthy(ctx context.Context) error {
	roots, err := c.rootPool(ctx)
	if err != nil {
		return err // the CA writes its root on start-up
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: ServerName}
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{
		Service: capb.IstioCertificateService_ServiceDesc.ServiceName,
	})
	if err != nil {
		return err
	}
	if s := resp.GetStatus(); s != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health: %s", s)
	}
	return nil
}

// ChildEnv is our environment without WORKLOAD_CA_* variables, which the
// binary would read as flag values: the command lines say it all. Use it
// for every workload-ca process a test or benchmark starts.
func ChildEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WORKLOAD_CA_") {
			env = append(env, kv)
		}
	}
	return env
}

// Stop sends SIGTERM, waits for a graceful exit (the CA's grace period is
// 15s), kills the process if it is still running, and removes a temporary
// work dir. It reports a non-zero exit status. Safe to call more than once.
func (c *CA) Stop() error {
	c.stopOnce.Do(func() {
		c.stopErr = errors.Join(c.proc.Terminate(20*time.Second), c.logFile.Close())
		if c.stopErr == nil && c.ownsWorkDir && !c.opts.KeepWorkDir {
			c.stopErr = os.RemoveAll(c.workDir)
		}
	})
	return c.stopErr
}

// Kill SIGKILLs the CA's process group, as a crashed or evicted replica:
// no graceful stop, the leader lease is not released. A temporary work dir
// is removed as by Stop. Stop afterwards does nothing; safe to call more
// than once.
func (c *CA) Kill() error {
	c.stopOnce.Do(func() {
		c.stopErr = errors.Join(c.proc.Kill(10*time.Second), c.logFile.Close())
		if c.stopErr == nil && c.ownsWorkDir && !c.opts.KeepWorkDir {
			c.stopErr = os.RemoveAll(c.workDir)
		}
	})
	return c.stopErr
}

// Exited reports whether the CA process has exited.
func (c *CA) Exited() bool { return c.proc.Exited() }

// Addr returns the CA's gRPC address, 127.0.0.1:<port>.
func (c *CA) Addr() string { return c.addr }

// CADir returns the CA directory (root-cert.pem and the CA key live here).
func (c *CA) CADir() string { return filepath.Join(c.workDir, "ca") }

// RootCertPath returns the PEM file of the roots that verify the CA.
func (c *CA) RootCertPath() string { return filepath.Join(c.CADir(), "root-cert.pem") }

// Roots returns the roots that verify the CA (Options.Roots, or
// RootCertPath) as a pool.
func (c *CA) Roots() (*x509.CertPool, error) {
	return c.rootPool(context.Background())
}

func (c *CA) rootPool(ctx context.Context) (*x509.CertPool, error) {
	pemBytes, err := c.RootsPEM(ctx)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("%s: no certificate", c.rootsSource())
	}
	return pool, nil
}

// RootsPEM returns the PEM roots that verify the CA: from Options.Roots
// when set, else from RootCertPath.
func (c *CA) RootsPEM(ctx context.Context) ([]byte, error) {
	if c.opts.Roots != nil {
		return c.opts.Roots(ctx)
	}
	return os.ReadFile(c.RootCertPath())
}

func (c *CA) rootsSource() string {
	if c.opts.Roots != nil {
		return "Options.Roots"
	}
	return c.RootCertPath()
}

// RootCertFile returns a file holding the roots for `workload-ca request
// --root-cert`: RootCertPath, or a temporary copy of what Options.Roots
// returns, removed by the returned func.
func (c *CA) RootCertFile(ctx context.Context) (string, func(), error) {
	if c.opts.Roots == nil {
		return c.RootCertPath(), func() {}, nil
	}
	pemBytes, err := c.opts.Roots(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("cahost: roots: %w", err)
	}
	f, err := os.CreateTemp(c.tokenDir(), "roots-")
	if err != nil {
		return "", nil, fmt.Errorf("cahost: %w", err)
	}
	_, err = f.Write(pemBytes)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", nil, fmt.Errorf("cahost: %w", err)
	}
	return f.Name(), func() { os.Remove(f.Name()) }, nil
}

// ClientConfig returns a caclient configuration for this CA, for checks
// that need the certificates themselves.
func (c *CA) ClientConfig() (caclient.Config, error) {
	roots, err := c.Roots()
	return caclient.Config{Address: c.addr, Roots: roots, ServerName: ServerName}, err
}

// LogPath returns the CA's log file.
func (c *CA) LogPath() string { return LogPath(c.workDir) }

// LogPath returns the log file of a CA started in workDir, also when it
// failed to start.
func LogPath(workDir string) string { return filepath.Join(workDir, "workload-ca.log") }

// Logs returns everything the CA has logged so far.
func (c *CA) Logs() string {
	b, err := os.ReadFile(c.LogPath())
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", c.LogPath(), err)
	}
	return string(b)
}

// WorkDir returns the work directory.
func (c *CA) WorkDir() string { return c.workDir }

// Pid returns the CA's process id.
func (c *CA) Pid() int { return c.proc.Pid() }

// StartupTime is how long the last start took, from exec to SERVING.
func (c *CA) StartupTime() time.Duration { return c.startup }

// Binary returns the workload-ca executable in use.
func (c *CA) Binary() string { return c.opts.Binary }

func (c *CA) tokenDir() string { return filepath.Join(c.workDir, "tokens") }
