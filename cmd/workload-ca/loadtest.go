package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"

	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/internal/cli"
	"github.com/workload-ca/workload-ca/internal/cliflag"
	"github.com/workload-ca/workload-ca/loadtest"
)

// loadtestUsage explains the plan file, which flags cannot.
const loadtestUsage = `Behaves like many ztunnels: each has its own connection (gRPC over TLS 1.3),
its own bearer token, at most --in-flight requests outstanding, and asks for
the identities of its node with ImpersonatedIdentity. Keys and CSRs (P-256,
ztunnel's shape) are pregenerated. Progress goes to stderr every second; the
summary (certs/s, latency percentiles, errors by gRPC code) to stdout.

The plan is a JSON array, one object per ztunnel:
  [{"token": "<pod-bound JWT of the ztunnel, audience istio-ca>",
    "identities": ["spiffe://cluster.local/ns/demo/sa/web", ...]}, ...]

Modes: the maximum rate (closed loop, the default); --rate R (open loop at R
requests/s in total, latency measured from when each request was due); --once
(a cold-start storm: every ztunnel asks for each identity once, all at the
same time, with no deadline per request, as ztunnel; --duration is then the
deadline of the storm, and --retry says how failures are retried: after
ztunnel's backoff, or at once).
`

// loadtestConfig is the validated configuration of `workload-ca loadtest`.
type loadtestConfig struct {
	run      loadtest.Config
	planFile string
	rootCert string
	limit    int
	json     bool
	quiet    bool
}

// loadtestCommand is `workload-ca loadtest`.
func loadtestCommand() cli.Command[loadtestConfig] {
	return cli.Command[loadtestConfig]{
		Use:       "loadtest --plan FILE --root-cert FILE",
		Short:     "Load the CA as many ztunnels would, and measure it",
		Long:      "Loads the CA as many ztunnels would, and measures it.\n\n" + loadtestUsage,
		Flags:     loadtestFlags,
		Exclusive: [][]string{{"once", "rate"}},
		Values:    map[string][]string{"output": {"text", "json"}, "retry": {loadtest.RetryZtunnel, loadtest.RetryAggressive}},
		Files:     []string{"plan", "root-cert"},
		Run:       runLoadtest,
	}
}

func loadtestFlags() (*pflag.FlagSet, func([]string) (loadtestConfig, error)) {
	fs := cliflag.New("loadtest")
	var c loadtestConfig
	r := &c.run
	var output string
	fs.Section("Plan and connection")
	fs.StringVar(&c.planFile, "plan", "", "JSON plan file: ztunnels with their tokens and identities (required)")
	fs.StringVar(&c.rootCert, "root-cert", "", "PEM file of the roots that verify the CA (required)")
	fs.StringVar(&r.Address, "addr", "localhost:15012", "CA address host:port")
	fs.StringVar(&r.ServerName, "server-name", "", "host name to verify in the CA's certificate (default: the host of --addr)")
	fs.IntVar(&c.limit, "ztunnels-limit", 0, "use only the first N ztunnels of the plan (0: all)")
	fs.IntVar(&r.CSRsPerIdentity, "csrs-per-identity", loadtest.DefaultCSRsPerIdentity, "pregenerated keys and CSRs per identity, used round-robin")
	fs.Section("Load")
	fs.DurationVar(&r.Duration, "duration", 10*time.Second, "measured window after the warm-up (with --once: the deadline of the storm)")
	fs.DurationVar(&r.Warmup, "warmup", 3*time.Second, "warm-up before the measured window, not counted")
	fs.Float64Var(&r.Rate, "rate", 0, "total target rate in requests/s, open loop; 0 is the maximum rate, closed loop")
	fs.BoolVar(&r.Once, "once", false, "cold-start storm: every ztunnel asks for each of its identities once, all at once")
	fs.StringVar(&r.Retry, "retry", loadtest.RetryZtunnel, "with --once, how a failed request is retried: ztunnel (after ztunnel's backoff, from 1s doubling to 150s, 20% jitter) or aggressive (at once)")
	fs.DurationVar(&r.Hold, "hold", 0, "with --once, keep the connections open and idle this long after the storm")
	fs.IntVar(&r.InFlight, "in-flight", loadtest.DefaultInFlight, "most requests outstanding per ztunnel")
	fs.DurationVar(&r.Timeout, "timeout", loadtest.DefaultTimeout, "deadline of each request, and of connecting")
	fs.DurationVar(&r.TTL, "ttl", loadtest.DefaultTTL, "requested certificate lifetime (validity_duration)")
	fs.Section("Output")
	fs.StringVar(&output, "output", "text", "summary format: text or json")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress lines on stderr")
	fs.BoolVar(&r.NoCheck, "no-check", false, "do not parse and check the responses (less client CPU)")
	fs.Example("plan", "plan.json")
	fs.Example("root-cert", "root-cert.pem")
	fs.Example("rate", "250")
	return fs.Done(), func([]string) (loadtestConfig, error) {
		var errs []error
		if c.planFile == "" || c.rootCert == "" {
			errs = append(errs, errors.New("--plan and --root-cert are required"))
		}
		if output != "text" && output != "json" {
			errs = append(errs, fmt.Errorf("--output %q: want text or json", output))
		}
		if r.Rate < 0 || r.Duration <= 0 || r.Warmup < 0 || r.InFlight <= 0 || c.limit < 0 {
			errs = append(errs, errors.New("--duration and --in-flight must be positive; --rate, --warmup and --ztunnels-limit not negative"))
		}
		if r.Once && r.Rate > 0 {
			errs = append(errs, errors.New("--once and --rate exclude each other"))
		}
		if r.Retry != loadtest.RetryZtunnel && r.Retry != loadtest.RetryAggressive {
			errs = append(errs, fmt.Errorf("--retry %q: want %s or %s", r.Retry, loadtest.RetryZtunnel, loadtest.RetryAggressive))
		}
		if r.Hold < 0 || (r.Hold > 0 && !r.Once) {
			errs = append(errs, errors.New("--hold must not be negative, and needs --once"))
		}
		c.json = output == "json"
		if err := errors.Join(errs...); err != nil {
			return c, fmt.Errorf("%w: %w", cli.ErrUsage, err)
		}
		return c, nil
	}
}

func runLoadtest(ctx context.Context, c loadtestConfig, stdout, stderr io.Writer) error {
	var err error
	if c.run.Roots, err = caclient.ReadRoots(c.rootCert); err != nil {
		return fmt.Errorf("--root-cert: %w", err)
	}
	plan, err := loadtest.ReadPlanFile(c.planFile)
	if err != nil {
		return fmt.Errorf("--plan: %w", err)
	}
	c.run.Plan = plan.Limit(c.limit)
	if !c.quiet {
		c.run.Progress = stderr
	}
	s, err := loadtest.Run(ctx, c.run)
	if err != nil {
		return err
	}
	if c.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(s)
	} else {
		err = s.WriteText(stdout)
	}
	if err != nil {
		return err
	}
	if s.Mode == "once" && s.ZtunnelsDone < s.Ztunnels {
		return fmt.Errorf("storm: %d of %d ztunnels never got all their certificates", s.Ztunnels-s.ZtunnelsDone, s.Ztunnels)
	}
	return nil
}
