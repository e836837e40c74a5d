package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/workload-ca/workload-ca/e2e/internal/proc"
)

// startEtcd starts etcd on fresh loopback ports and waits for /health.
func (c *ControlPlane) startEtcd(ctx context.Context) error {
	ports, err := proc.FreePorts(2)
	if err != nil {
		return err
	}
	dataDir := filepath.Join(c.workDir, "etcd-data")
	if err := os.RemoveAll(dataDir); err != nil { // left by a failed attempt
		return err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	args := []string{
		"--name=default",
		"--data-dir=" + dataDir,
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=default=" + peer,
		"--initial-cluster-state=new",
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	}
	began := time.Now()
	if c.etcd, err = c.startServer("etcd", args); err != nil {
		return err
	}
	c.etcdURL = client
	if err := waitFor(ctx, c.etcd, 30*time.Second, func(ctx context.Context) error {
		return etcdHealthy(ctx, client)
	}); err != nil {
		return err
	}
	c.timings.EtcdHealthy = time.Since(began)
	return nil
}

// etcdHealthy checks etcd's /health endpoint.
func etcdHealthy(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
		return fmt.Errorf("etcd /health: %s %s", resp.Status, body)
	}
	return nil
}

// startAPIServer starts kube-apiserver on a fresh port and waits for /readyz.
func (c *ControlPlane) startAPIServer(ctx context.Context) error {
	ports, err := proc.FreePorts(1)
	if err != nil {
		return err
	}
	c.apiPort = ports[0]
	c.host = fmt.Sprintf("https://127.0.0.1:%d", c.apiPort)
	if err := c.makeClient(); err != nil {
		return err
	}
	return c.runAPIServer(ctx)
}

// runAPIServer starts kube-apiserver on c.apiPort and waits for /readyz.
func (c *ControlPlane) runAPIServer(ctx context.Context) error {
	began := time.Now()
	args := flagArgs(c.apiServerFlags(c.apiPort), c.opts.ExtraAPIServerFlags)
	var err error
	if c.apiserver, err = c.startServer("kube-apiserver", args); err != nil {
		return err
	}
	if err := waitFor(ctx, c.apiserver, c.opts.ReadyTimeout, c.readyz); err != nil {
		return err
	}
	c.timings.APIServerReady = time.Since(began)
	return nil
}

// StopAPIServer kills kube-apiserver, as a crash would; etcd keeps
// running, and clients see connections refused until StartAPIServer.
func (c *ControlPlane) StopAPIServer() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.apiserver.Kill(10 * time.Second)
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the
// same address with the same flags (and the service account keys of
// RotateServiceAccountKey, if called since), and waits until it is ready.
func (c *ControlPlane) StartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.apiserver.Exited() {
		return errors.New("controlplane: kube-apiserver is running")
	}
	return c.runAPIServer(ctx)
}

func (c *ControlPlane) apiServerFlags(port int) map[string]string {
	return map[string]string{
		"etcd-servers":                     c.etcdURL,
		"bind-address":                     "127.0.0.1",
		"advertise-address":                "127.0.0.1",
		"endpoint-reconciler-type":         "none",
		"secure-port":                      strconv.Itoa(port),
		"cert-dir":                         filepath.Join(c.workDir, "apiserver-certs"),
		"tls-cert-file":                    c.pki.servingCertFile,
		"tls-private-key-file":             c.pki.servingKeyFile,
		"client-ca-file":                   c.pki.caFile,
		"service-cluster-ip-range":         "10.0.0.0/24",
		"service-account-issuer":           "https://kubernetes.default.svc",
		"service-account-key-file":         c.pki.saPubFile,
		"service-account-signing-key-file": c.pki.saKeyFile,
		"api-audiences":                    "https://kubernetes.default.svc,istio-ca",
		"authorization-mode":               "Node,RBAC",
		"enable-admission-plugins":         "NodeRestriction",
		"audit-log-path":                   c.auditLog,
		"audit-policy-file":                filepath.Join(c.workDir, "audit-policy.yaml"),
	}
}

// flagArgs merges extra into base and renders sorted --name=value args.
func flagArgs(base, extra map[string]string) []string {
	for k, v := range extra {
		base[strings.TrimLeft(k, "-")] = v
	}
	args := make([]string, 0, len(base))
	for k, v := range base {
		args = append(args, "--"+k+"="+v)
	}
	sort.Strings(args)
	return args
}

func (c *ControlPlane) startServer(name string, args []string) (*proc.Process, error) {
	stdout, stderr, err := c.logWriters(name)
	if err != nil {
		return nil, err
	}
	env := proc.Environ("TMPDIR=" + filepath.Join(c.workDir, "tmp"))
	return proc.Start(name, filepath.Join(c.opts.BinDir, name), args, env, stdout, stderr)
}

// makeClient builds the admin config and clientset for c.host.
func (c *ControlPlane) makeClient() error {
	c.restConfig = &rest.Config{
		Host: c.host,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   c.pki.caPEM,
			CertData: c.pki.adminCertPEM,
			KeyData:  c.pki.adminKeyPEM,
		},
		QPS:   100,
		Burst: 200,
	}
	var err error
	c.client, err = kubernetes.NewForConfig(c.restConfig)
	return err
}

// readyz checks the apiserver's /readyz as admin.
func (c *ControlPlane) readyz(ctx context.Context) error {
	body, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("/readyz: %w: %s", err, body)
	}
	return nil
}

// waitFor polls check until it succeeds, p exits, or timeout or ctx ends.
func waitFor(ctx context.Context, p *proc.Process, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, 2*time.Second)
		err := check(attempt)
		cancelAttempt()
		if err == nil {
			return nil
		}
		select {
		case <-p.Done():
			return p.StartupError()
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v: %w; last output:\n%s", p.Name(), timeout, err, p.Tail())
		case <-tick.C:
		}
	}
}
