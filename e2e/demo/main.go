// Command demo runs workload-ca against a local kube-apiserver and etcd,
// requests certificates the way ztunnel does, prints them with what a user
// needs to try `workload-ca request` by hand, and stops everything on
// Ctrl-C (or at once with --exit or DEMO_EXIT=1). `make demo` runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
)

const (
	node     = "demo-node"
	audience = "istio-ca"
)

func main() { os.Exit(mainCode()) }

func mainCode() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	return 0
}

// run is the demo; it returns when ctx ends (or at once with --exit),
// having stopped the CA and the control plane.
func run(ctx context.Context, args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	exit := fs.Bool("exit", os.Getenv("DEMO_EXIT") == "1", "stop right after printing the results (also DEMO_EXIT=1)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, v := range []string{controlplane.EnvBinDir, cahost.EnvBinary} {
		if os.Getenv(v) == "" {
			return fmt.Errorf("%s is unset: run `make demo`, which builds what the demo needs and sets it", v)
		}
	}

	fmt.Fprintln(out, "Starting etcd and kube-apiserver...")
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cp.Stop()) }()
	fmt.Fprintln(out, "Starting workload-ca...")
	ca, err := cahost.Start(ctx, cahost.Options{
		Kubeconfig: cp.KubeconfigPath(),
		WorkDir:    filepath.Join(cp.WorkDir(), "workload-ca"), // removed with the control plane's
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, ca.Stop()) }()

	d := &demo{cp: cp, ca: ca, out: out}
	if err := d.show(ctx); err != nil {
		return err
	}
	if *exit {
		fmt.Fprintln(out, "\nStopping (--exit).")
		return nil
	}
	fmt.Fprintln(out, "\nPress Ctrl-C to stop.")
	<-ctx.Done()
	fmt.Fprintln(out, "\nStopping.")
	return nil
}

// demo is one run's state.
type demo struct {
	cp         *controlplane.ControlPlane
	ca         *cahost.CA
	out        io.Writer
	tokenFile  string // ztunnel's token, for the user to try
	ztunnelTok string
}

// show creates the cluster objects, requests the certificates and prints
// everything.
func (d *demo) show(ctx context.Context) error {
	if err := d.createObjects(ctx); err != nil {
		return err
	}
	cpt := d.cp.Timings()
	p := func(format string, args ...any) { fmt.Fprintf(d.out, format, args...) }
	p("\nworkload-ca demo\n")
	p("  kube-apiserver  %s (ready in %v; etcd in %v)\n", d.cp.Host(), round(cpt.APIServerReady), round(cpt.EtcdHealthy))
	p("  kubeconfig      %s\n", d.cp.KubeconfigPath())
	p("  workload-ca     %s (TLS name %s; start to SERVING in %v)\n", d.ca.Addr(), cahost.ServerName, round(d.ca.StartupTime()))
	p("  root cert       %s\n", d.ca.RootCertPath())
	p("  CA log          %s\n", d.ca.LogPath())
	p("\nNode %s runs istio-system/ztunnel (pod ztunnel-demo), demo/web (pod web-0) and demo/db (pod db-0).\n", node)
	p("Certificates requested as ztunnel does, with its pod-bound token (audience %s) and ImpersonatedIdentity:\n", audience)
	for _, sa := range []string{"web", "db"} {
		id := "spiffe://cluster.local/ns/demo/sa/" + sa
		res, err := d.ca.Request(ctx, cahost.RequestArgs{Token: d.ztunnelTok, Identity: id, Impersonate: true})
		if err != nil {
			return fmt.Errorf("request %s: %w", id, err)
		}
		printResult(d.out, res)
	}
	refused := "spiffe://cluster.local/ns/demo/sa/payments"
	_, err := d.ca.Request(ctx, cahost.RequestArgs{Token: d.ztunnelTok, Identity: refused, Impersonate: true})
	var r *cahost.RefusedError
	if !errors.As(err, &r) {
		return fmt.Errorf("request %s (no pod on %s): want a refusal, got %w", refused, node, err)
	}
	p("\n  %s (no pod on %s)\n    refused    %s: %s\n", refused, node, r.Code, r.Message)

	p("\nTry it yourself (the token is ztunnel's):\n")
	p("  %s request --addr %s --server-name %s \\\n    --root-cert %s \\\n    --token-file %s \\\n    --identity spiffe://cluster.local/ns/demo/sa/web\n",
		relative(d.ca.Binary()), d.ca.Addr(), cahost.ServerName, d.ca.RootCertPath(), d.tokenFile)
	p("  kubectl --kubeconfig %s get pods -A -o wide\n", d.cp.KubeconfigPath())
	return nil
}

// createObjects creates the namespaces, the node, the service accounts and
// pods, and ztunnel's token (also written to a file).
func (d *demo) createObjects(ctx context.Context) error {
	for _, ns := range []string{"istio-system", "demo"} {
		if _, err := d.cp.CreateNamespace(ctx, ns); err != nil {
			return err
		}
	}
	if _, err := d.cp.CreateNode(ctx, node); err != nil {
		return err
	}
	var ztunnel *corev1.Pod
	for _, p := range [][3]string{{"istio-system", "ztunnel", "ztunnel-demo"}, {"demo", "web", "web-0"}, {"demo", "db", "db-0"}} {
		if _, err := d.cp.CreateServiceAccount(ctx, p[0], p[1]); err != nil {
			return err
		}
		pod, err := d.cp.CreatePod(ctx, p[0], p[2], p[1], node)
		if err != nil {
			return err
		}
		if ztunnel == nil {
			ztunnel = pod
		}
	}
	var err error
	if d.ztunnelTok, err = d.cp.PodToken(ctx, "istio-system", "ztunnel", ztunnel, audience, 43200); err != nil {
		return err
	}
	d.tokenFile = filepath.Join(d.cp.WorkDir(), "ztunnel-token")
	return os.WriteFile(d.tokenFile, []byte(d.ztunnelTok), 0o600)
}

func printResult(w io.Writer, r cahost.Result) {
	chain := append([]string{"leaf"}, r.Chain...)
	chain = append(chain, "[root bundle: "+strings.Join(r.Roots, "; ")+"]")
	fmt.Fprintf(w, "\n  %s\n    serial     %s\n    validity   %s .. %s (%v)\n    chain      %s\n",
		r.SPIFFEID, r.Serial, r.NotBefore.Format(time.RFC3339), r.NotAfter.Format(time.RFC3339),
		r.NotAfter.Sub(r.NotBefore).Round(time.Second), strings.Join(chain, " -> "))
}

// relative shortens path to ./-relative when it is under the working
// directory (bin/workload-ca under the repository).
func relative(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	rel, err := filepath.Rel(wd, path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return path
	}
	return rel
}

func round(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
