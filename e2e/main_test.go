package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
)

// audience is what the CA accepts (its default --token-audiences).
const audience = "istio-ca"

// envKeep, when set, keeps the suite's work dir (logs, audit log,
// kubeconfig) even when every test passes.
const envKeep = "WORKLOAD_CA_E2E_KEEP"

// env is the suite's control plane and CA; nil when skipReason is set.
var (
	env        *suite
	skipReason string
)

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	if v := cahost.MissingEnv(); v != "" {
		skipReason = v + " is unset: run `make e2e`, which builds the control plane and bin/workload-ca and sets it"
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	s, err := newSuite(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: set-up failed:", err)
		return 1
	}
	env = s
	code := m.Run()
	if err := s.close(code != 0); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: tear-down:", err)
		code = 1
	}
	return code
}

// suite is the shared fixture: a control plane with nodes node-a and
// node-b, ztunnel (istio-system/ztunnel) on each, workloads demo/web and
// demo/api on node-a and demo/db on node-b only, and a CA.
type suite struct {
	workDir string
	cp      *controlplane.ControlPlane
	ca      *cahost.CA
	setup   time.Duration
	// runs counts the runs of TestWorkloadCA (go test -count).
	runs int

	pods map[string]*corev1.Pod // by "namespace/name"

	ztunnelA, ztunnelB string // tokens of the ztunnel pods
	webToken           string // token of demo/web-0

	mu     sync.Mutex
	tokens []string // every token handed to the CA, for the log check
}

// fixturePods are created before the CA starts: namespace, name, service
// account, node.
var fixturePods = [][4]string{
	{"istio-system", "ztunnel-a", "ztunnel", "node-a"},
	{"istio-system", "ztunnel-b", "ztunnel", "node-b"},
	{"demo", "web-0", "web", "node-a"},
	{"demo", "api-0", "api", "node-a"},
	{"demo", "db-0", "db", "node-b"},
	{"other", "ztunnel-a", "ztunnel", "node-a"}, // same name, not a node agent
}

func newSuite(ctx context.Context) (s *suite, err error) {
	began := time.Now()
	s = &suite{pods: map[string]*corev1.Pod{}}
	if s.workDir, err = os.MkdirTemp("", "workload-ca-e2e-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.close(true))
		}
	}()
	s.cp, err = controlplane.Start(ctx, controlplane.Options{WorkDir: filepath.Join(s.workDir, "controlplane")})
	if err != nil {
		return s, err
	}
	if err := s.createFixture(ctx); err != nil {
		return s, err
	}
	if err := s.startCA(ctx); err != nil {
		return s, err
	}
	s.setup = time.Since(began)
	return s, nil
}

// runName returns name for the first run of TestWorkloadCA and name-runN
// for the N-th (go test -count): objects and directories that a run
// creates under fixed names would already exist in the next.
func (s *suite) runName(name string) string {
	if s.runs <= 1 {
		return name
	}
	return fmt.Sprintf("%s-run%d", name, s.runs)
}

// startCA starts the suite's CA, in a work dir of its own: "ca" for the
// first run of TestWorkloadCA, "ca-runN" for the N-th, which starts it
// again after the last run stopped it.
func (s *suite) startCA(ctx context.Context) (err error) {
	s.ca, err = cahost.Start(ctx, cahost.Options{
		Kubeconfig: s.cp.KubeconfigPath(), // admin for now; the chart's RBAC comes later
		WorkDir:    filepath.Join(s.workDir, s.runName("ca")),
		ExtraArgs:  []string{"--cluster-id", "Kubernetes"}, // Istio's default, which ztunnel sends
	})
	return err
}

func (s *suite) createFixture(ctx context.Context) error {
	for _, ns := range []string{"istio-system", "demo", "other"} {
		if _, err := s.cp.CreateNamespace(ctx, ns); err != nil {
			return err
		}
	}
	for _, node := range []string{"node-a", "node-b"} {
		if _, err := s.cp.CreateNode(ctx, node); err != nil {
			return err
		}
	}
	for _, sa := range [][2]string{{"istio-system", "ztunnel"}, {"other", "ztunnel"},
		{"demo", "web"}, {"demo", "api"}, {"demo", "db"}, {"demo", "temp"}, {"demo", "gone"}} {
		if _, err := s.cp.CreateServiceAccount(ctx, sa[0], sa[1]); err != nil {
			return err
		}
	}
	for _, p := range fixturePods {
		pod, err := s.cp.CreatePod(ctx, p[0], p[1], p[2], p[3])
		if err != nil {
			return err
		}
		s.pods[p[0]+"/"+p[1]] = pod
	}
	var err error
	if s.ztunnelA, err = s.mint(ctx, "istio-system/ztunnel-a", audience, 43200); err != nil {
		return err
	}
	if s.ztunnelB, err = s.mint(ctx, "istio-system/ztunnel-b", audience, 43200); err != nil {
		return err
	}
	s.webToken, err = s.mint(ctx, "demo/web-0", audience, 3600)
	return err
}

// mint returns a token bound to the pod "namespace/name" for its service
// account, and remembers it for the log check.
func (s *suite) mint(ctx context.Context, pod, aud string, seconds int64) (string, error) {
	p, ok := s.pods[pod]
	if !ok {
		return "", fmt.Errorf("no fixture pod %s", pod)
	}
	return s.mintFor(ctx, p, aud, seconds)
}

func (s *suite) mintFor(ctx context.Context, p *corev1.Pod, aud string, seconds int64) (string, error) {
	tok, err := s.cp.PodToken(ctx, p.Namespace, p.Spec.ServiceAccountName, p, aud, seconds)
	if err == nil {
		s.remember(tok)
	}
	return tok, err
}

func (s *suite) remember(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens = append(s.tokens, token)
}

// close stops the CA and the control plane; the work dir is kept (and
// named) when failed.
func (s *suite) close(failed bool) error {
	var err error
	if s.ca != nil {
		err = s.ca.Stop()
	}
	if s.cp != nil {
		err = errors.Join(err, s.cp.Stop())
	}
	if failed || err != nil || os.Getenv(envKeep) != "" {
		caLog := "none"
		if s.ca != nil {
			caLog = s.ca.LogPath()
		}
		fmt.Fprintf(os.Stderr, "e2e: work dir kept: %s (CA log: %s, audit log: %s)\n",
			s.workDir, caLog, filepath.Join(s.workDir, "controlplane", "audit.log"))
		return err
	}
	return errors.Join(err, os.RemoveAll(s.workDir))
}

// suiteFor returns the shared fixture, or skips t.
func suiteFor(t *testing.T) *suite {
	t.Helper()
	if env == nil {
		t.Skip(skipReason)
	}
	return env
}

// TestWorkloadCA runs the request cases in parallel, then the cases that
// must run alone, in order.
func TestWorkloadCA(t *testing.T) {
	s := suiteFor(t)
	if s.runs++; s.runs > 1 {
		// A fresh CA: the last run's ended with its stop test (Stop is
		// safe to call again, as when -run left that test out).
		if err := s.ca.Stop(); err != nil {
			t.Fatalf("the last run's CA: %v", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		err := s.startCA(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	cpt := s.cp.Timings()
	t.Logf("etcd healthy in %v, kube-apiserver ready in %v, workload-ca start→SERVING %v; set-up %v",
		cpt.EtcdHealthy.Round(time.Millisecond), cpt.APIServerReady.Round(time.Millisecond),
		s.ca.StartupTime().Round(time.Millisecond), s.setup.Round(time.Millisecond))

	t.Run("requests", func(t *testing.T) {
		for _, c := range append(s.authzCases(), s.authnCases()...) {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				c.run(t)
			})
		}
	})
	// Alone: they count apiserver calls, read the whole log, or stop the CA.
	t.Run("local verification: 20 requests with one new token make no TokenReview", s.testTokenReviewCache)
	t.Run("observability: metrics, health, Prometheus and audit records", s.testObservability)
	t.Run("the CA stops cleanly on SIGTERM", s.testStop)
	t.Run("the CA log holds none of the tokens used", s.testLogsHoldNoToken)
}

// testCase is one subtest of the parallel group.
type testCase struct {
	name string
	run  func(t *testing.T)
}

// request runs `workload-ca request` with a 30s bound.
func (s *suite) request(t *testing.T, args cahost.RequestArgs) (cahost.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	return s.ca.Request(ctx, args)
}

// id returns the SPIFFE ID of namespace/serviceAccount in cluster.local.
func id(ns, sa string) string { return "spiffe://cluster.local/ns/" + ns + "/sa/" + sa }

// createPod creates a pod and waits for nothing.
func (s *suite) createPod(t *testing.T, ns, name, sa, node string) *corev1.Pod {
	t.Helper()
	pod, err := s.cp.CreatePod(t.Context(), ns, name, sa, node)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// deletePod deletes a pod at once (grace period 0); without a kubelet it
// is gone from the API when the call returns.
func (s *suite) deletePod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	zero := int64(0)
	err := s.cp.Client().CoreV1().Pods(pod.Namespace).Delete(t.Context(), pod.Name,
		metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if err != nil {
		t.Fatal(err)
	}
}

func (s *suite) testStop(t *testing.T) {
	if err := s.ca.Stop(); err != nil {
		t.Fatalf("stop: %v\nlast log lines:\n%s", err, lastLines(s.ca.Logs(), 10))
	}
	if !strings.Contains(s.ca.Logs(), `"msg":"stopped"`) {
		t.Errorf("no \"stopped\" log line after SIGTERM:\n%s", lastLines(s.ca.Logs(), 10))
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
