// Command workload-ca is a certificate authority that gives every Kubernetes
// workload a SPIFFE identity, speaking Istio's certificate service protocol.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/workload-ca/workload-ca/internal/gcdefault"
)

// version, revision and commitTime are set at build time with -ldflags
// "-X main.version=..." (make build does); revision and commitTime fall
// back to what the toolchain stamped, if it did.
var version, revision, commitTime = "dev", "", ""

const usage = `workload-ca: a certificate authority for SPIFFE workload identities

Usage:
  workload-ca serve   [flags]   run the CA (gRPC IstioCertificateService)
  workload-ca request [flags]   request a certificate as ztunnel would
  workload-ca loadtest [flags]  load the CA as many ztunnels would, and measure it
  workload-ca inspect [flags] [file...]
                                describe certificates or ClusterTrustBundles:
                                identities, expiry, which root signs what
  workload-ca version           print the version
  workload-ca help [serve | config-reference]
                                this text, the flags of serve, or their
                                reference as Markdown

Run "workload-ca <command> -h" for the flags of a command.
`

func main() {
	gcdefault.Set()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes a subcommand and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = runServe(ctx, args[1:], stdout, stderr)
	case "request":
		err = runRequest(ctx, args[1:], stdout, stderr)
	case "loadtest":
		err = runLoadtest(ctx, args[1:], stdout, stderr)
	case "inspect":
		err = runInspect(ctx, args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, readBuild())
	case "help", "-h", "--help":
		err = runHelp(args[1:], stdout)
	default:
		fmt.Fprintf(stderr, "unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, "workload-ca:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "workload-ca:", err)
		return 1
	}
}

// runHelp prints the usage, the flags of serve, or their reference.
func runHelp(args []string, stdout io.Writer) error {
	switch {
	case len(args) == 0:
		fmt.Fprint(stdout, usage)
		return nil
	case len(args) == 1 && args[0] == "serve":
		fs, _ := serveFlags()
		fs.SetOutput(stdout)
		fmt.Fprintln(stdout, "Usage of workload-ca serve (each flag also WORKLOAD_CA_<FLAG>):")
		fs.PrintDefaults()
		return nil
	case len(args) == 1 && args[0] == "config-reference":
		return writeConfigReference(stdout)
	}
	return fmt.Errorf("%w: help %q: want serve or config-reference", errUsage, strings.Join(args, " "))
}

// errUsage is wrapped by invalid command lines.
var errUsage = errors.New("usage")
