package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/workload-ca/workload-ca/internal/cli"
)

// newRoot is the command tree; every command writes to stdout and stderr.
func newRoot(stdout, stderr io.Writer) *cobra.Command {
	return cli.NewRoot(&cobra.Command{
		Use:   "workload-ca <command>",
		Short: "A certificate authority for SPIFFE workload identities",
		Long: `workload-ca: a certificate authority for SPIFFE workload identities.
It serves Istio's certificate service protocol (IstioCertificateService) to
ztunnel and istio-agent, authenticates callers by their Kubernetes tokens,
and publishes its roots as ClusterTrustBundles.`,
		Version: readBuild().String(),
	}, stdout, stderr,
		serveCommand().Cobra(stdout, stderr),
		requestCommand().Cobra(stdout, stderr),
		loadtestCommand().Cobra(stdout, stderr),
		inspectCommand().Cobra(stdout, stderr),
		&cobra.Command{
			Use:   "version",
			Short: "Print the version, commit, its date and the Go version",
			Args:  cobra.NoArgs,
			Run:   func(*cobra.Command, []string) { fmt.Fprintln(stdout, readBuild()) },
		},
		&cobra.Command{
			Use:   "config-reference",
			Short: "Print the reference of serve's flags as Markdown (docs/configuration-reference.md)",
			Args:  cobra.NoArgs,
			RunE:  func(*cobra.Command, []string) error { return writeConfigReference(stdout) },
		},
	)
}

// run executes a command line and returns the process exit code: 0, 1
// when the work failed, 2 for a usage error (one line per problem, each
// naming its flag and an example value).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Execute(ctx, newRoot(stdout, stderr), args, stderr)
}
