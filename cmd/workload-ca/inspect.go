package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/internal/cli"
	"github.com/workload-ca/workload-ca/internal/cliflag"
	"github.com/workload-ca/workload-ca/internal/inspect"
	"github.com/workload-ca/workload-ca/trust/clustertrustbundle"
)

// inspectConfig is the validated configuration of `workload-ca inspect`.
type inspectConfig struct {
	Files      []string
	Bundle     string // --cluster-trust-bundle
	Signer     string // --signer
	Kubeconfig string
	JSON       bool
}

// inspectCommand is `workload-ca inspect`.
func inspectCommand() cli.Command[inspectConfig] {
	return cli.Command[inspectConfig]{
		Use:   "inspect [PEM file...]",
		Short: "Describe certificates or ClusterTrustBundles: identities, expiry, which root signs what",
		Long: `Describes certificates (a chain, a root bundle, cert-chain.pem, root-cert.pem),
or the ClusterTrustBundles of a name or signer: identities, validity, and
which certificate signs which.`,
		Flags:     inspectFlags,
		Args:      true,
		Exclusive: [][]string{{"cluster-trust-bundle", "signer"}},
		Values:    map[string][]string{"output": {"text", "json"}},
		Files:     []string{"kubeconfig"},
		Run:       runInspect,
	}
}

func inspectFlags() (*pflag.FlagSet, func([]string) (inspectConfig, error)) {
	fs := cliflag.New("inspect")
	var c inspectConfig
	var output string
	fs.Section("ClusterTrustBundles")
	fs.StringVar(&c.Bundle, "cluster-trust-bundle", "", "inspect the ClusterTrustBundle of this name")
	fs.StringVar(&c.Signer, "signer", "", "inspect every ClusterTrustBundle of this signer, e.g. workload-ca.io/spiffe")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file for --cluster-trust-bundle and --signer (default: KUBECONFIG, then in-cluster)")
	fs.Section("Output")
	fs.StringVar(&output, "output", "text", "output format: text or json")
	fs.Example("cluster-trust-bundle", "workload-ca.io:spiffe:1f2e3d4c5b6a7988")
	fs.Example("kubeconfig", "$HOME/.kube/config")
	return fs.Done(), func(files []string) (inspectConfig, error) {
		c.Files = files
		switch output {
		case "text":
		case "json":
			c.JSON = true
		default:
			return c, fmt.Errorf("%w: --output %q: want text or json", cli.ErrUsage, output)
		}
		switch {
		case c.Bundle != "" && c.Signer != "":
			return c, fmt.Errorf("%w: --cluster-trust-bundle and --signer are exclusive", cli.ErrUsage)
		case len(c.Files) == 0 && c.Bundle == "" && c.Signer == "":
			return c, fmt.Errorf("%w: nothing to inspect: give PEM files, --cluster-trust-bundle NAME or --signer NAME (e.g. workload-ca inspect root-cert.pem)", cli.ErrUsage)
		}
		return c, nil
	}
}

func runInspect(ctx context.Context, c inspectConfig, stdout, _ io.Writer) error {
	var sets []inspect.Set
	for _, f := range c.Files {
		raw, err := os.ReadFile(f) //nolint:gosec // the files the user asked to inspect
		if err != nil {
			return err
		}
		set, err := inspect.FromPEM(f, raw)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		sets = append(sets, set)
	}
	if c.Bundle != "" || c.Signer != "" {
		bundles, err := findBundles(ctx, c)
		if err != nil {
			return err
		}
		sets = append(sets, bundles...)
	}
	now := time.Now()
	var out []inspect.Cert
	for _, s := range sets {
		out = append(out, inspect.Describe(s, now)...)
	}
	if c.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	inspect.WriteText(stdout, out, now)
	return nil
}

// findBundles reads the ClusterTrustBundles c names from the API server.
func findBundles(ctx context.Context, c inspectConfig) ([]inspect.Set, error) {
	cfg, err := loadKubeConfig(c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	bundles, err := clustertrustbundle.Find(ctx, client, c.Bundle, c.Signer)
	if err != nil {
		return nil, err
	}
	if len(bundles) == 0 {
		return nil, fmt.Errorf("no ClusterTrustBundle %s", strings.TrimSpace("named "+c.Bundle+" "+signerPart(c.Signer)))
	}
	var sets []inspect.Set
	for _, b := range bundles {
		set, err := inspect.FromPEM("ClusterTrustBundle "+b.Name+signerPart(b.Spec.SignerName), []byte(b.Spec.TrustBundle))
		if err != nil {
			return nil, fmt.Errorf("ClusterTrustBundle %s: %w", b.Name, err)
		}
		sets = append(sets, set)
	}
	return sets, nil
}

func signerPart(signer string) string {
	if signer == "" {
		return ""
	}
	return " (signer " + signer + ")"
}
