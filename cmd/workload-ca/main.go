// Command workload-ca is a certificate authority that gives every
// Kubernetes workload a SPIFFE identity, speaking Istio's certificate
// service protocol.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	// The KMS and HSM types --ca-key-uri may name.
	_ "github.com/workload-ca/workload-ca/ca/keystore/kmstypes"
	"github.com/workload-ca/workload-ca/internal/gcdefault"
)

// version, revision and commitTime are set at build time with -ldflags
// "-X main.version=..." (make build does); revision and commitTime fall
// back to what the toolchain stamped, if it did.
var version, revision, commitTime = "dev", "", ""

func main() {
	gcdefault.Set()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
