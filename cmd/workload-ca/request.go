package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/status"

	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/internal/cli"
	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// requestConfig is the validated configuration of `workload-ca request`.
type requestConfig struct {
	Addr        string
	ServerName  string
	RootCert    string
	TokenFile   string
	Identity    spiffeid.ID
	Impersonate bool
	TTL         time.Duration
	Timeout     time.Duration
	OutDir      string
	JSON        bool
	ClusterID   string
}

// requestCommand is `workload-ca request`.
func requestCommand() cli.Command[requestConfig] {
	return cli.Command[requestConfig]{
		Use:   "request --root-cert FILE --token-file FILE --identity SPIFFE-ID",
		Short: "Request a certificate as ztunnel would",
		Long: `Requests a certificate as ztunnel does: a P-256 key and CSR, the bearer
token of --token-file, the identity as ImpersonatedIdentity metadata, over
TLS verified with --root-cert. Prints the chain (or writes it to --out-dir).`,
		Flags:  requestFlags,
		Values: map[string][]string{"output": {"text", "json"}},
		Dirs:   []string{"out-dir"},
		Files:  []string{"root-cert", "token-file"},
		Run:    runRequest,
	}
}

func requestFlags() (*pflag.FlagSet, func([]string) (requestConfig, error)) {
	fs := cliflag.New("request")
	var c requestConfig
	var id, output string
	fs.Section("Connection")
	fs.StringVar(&c.Addr, "addr", "localhost:15012", "CA address host:port (ztunnel's CA_ADDRESS)")
	fs.StringVar(&c.ServerName, "server-name", "", "host name to verify in the CA's certificate (default: the host of --addr)")
	fs.StringVar(&c.RootCert, "root-cert", "", "PEM file of the roots that verify the CA (required)")
	fs.DurationVar(&c.Timeout, "timeout", 10*time.Second, "deadline of the request")
	fs.Section("Request")
	fs.StringVar(&c.TokenFile, "token-file", "", "file holding the bearer token, re-read on every call as ztunnel does (required)")
	fs.StringVar(&id, "identity", "", "SPIFFE ID to request, e.g. spiffe://cluster.local/ns/demo/sa/web (required)")
	fs.BoolVar(&c.Impersonate, "impersonate", true, "send the identity as ImpersonatedIdentity metadata (ztunnel's shared mode); false asks for the caller's own identity")
	fs.DurationVar(&c.TTL, "ttl", 24*time.Hour, "requested lifetime (validity_duration)")
	fs.StringVar(&c.ClusterID, "cluster-id", caclient.DefaultClusterID, "cluster id sent in the clusterid header (ztunnel's CLUSTER_ID)")
	fs.Section("Output")
	fs.StringVar(&c.OutDir, "out-dir", "", "write cert-chain.pem, key.pem and root-cert.pem here")
	fs.StringVar(&output, "output", "text", "output format: text or json")
	fs.Example("root-cert", "root-cert.pem")
	fs.Example("token-file", "/var/run/secrets/tokens/istio-token")
	fs.Example("identity", "spiffe://cluster.local/ns/demo/sa/web")
	fs.Example("server-name", "istiod.istio-system.svc")
	fs.Example("out-dir", "./certs")
	return fs.Done(), func([]string) (requestConfig, error) {
		var errs []error
		var err error
		if c.Identity, err = spiffeid.FromString(id); err != nil {
			errs = append(errs, fmt.Errorf("--identity: %w", err))
		}
		if c.RootCert == "" || c.TokenFile == "" {
			errs = append(errs, errors.New("--root-cert and --token-file are required"))
		}
		if output != "text" && output != "json" {
			errs = append(errs, fmt.Errorf("--output %q: want text or json", output))
		}
		c.JSON = output == "json"
		if err := errors.Join(errs...); err != nil {
			return c, fmt.Errorf("%w: %w", cli.ErrUsage, err)
		}
		return c, nil
	}
}

func runRequest(ctx context.Context, cfg requestConfig, stdout, _ io.Writer) error {
	pool, err := caclient.ReadRoots(cfg.RootCert)
	if err != nil {
		return fmt.Errorf("--root-cert: %w", err)
	}
	token, err := os.ReadFile(cfg.TokenFile)
	if err != nil {
		return fmt.Errorf("--token-file: %w", err)
	}
	client, err := caclient.Dial(caclient.Config{Address: cfg.Addr, Roots: pool, ServerName: cfg.ServerName})
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	res, err := client.CreateCertificate(ctx, caclient.Request{
		Token: strings.TrimSpace(string(token)), Identity: cfg.Identity, Impersonate: cfg.Impersonate, TTL: cfg.TTL,
		ClusterID: cfg.ClusterID,
	})
	if err != nil {
		if st, ok := status.FromError(err); ok {
			return fmt.Errorf("request refused: code=%s message=%q", st.Code(), st.Message())
		}
		return err
	}
	if err := res.Verify(); err != nil {
		return fmt.Errorf("issued certificate does not verify against the returned roots: %w", err)
	}
	if cfg.OutDir != "" {
		if err := res.WriteFiles(cfg.OutDir); err != nil {
			return err
		}
	}
	return res.Print(stdout, cfg.JSON)
}
