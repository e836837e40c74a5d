package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/e2e/internal/vaultserver"
)

// measureUpstream compares the maximum rate of a CA signing with an
// intermediate a real Vault issued (--ca-upstream-config) with that of the
// CA on its local root (--ca-dir), round by round, interleaved, so the two
// see the same machine conditions. Signing is local either way: the
// figure is the ratio of the medians, and the target is that it shows no
// cost (0.95 or more; the rounds' spread is the machine's).
func (b *bench) measureUpstream(ctx context.Context, cp *controlplane.ControlPlane, plan string) (err error) {
	if b.opts.vault == "" {
		return fmt.Errorf("upstream: no Vault binary: set %s (make bench builds it) or --vault, or --upstream-rounds 0", vaultserver.EnvBinary)
	}
	b.logf("upstream: starting Vault, its PKI engine the CA's upstream")
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	dir := filepath.Join(b.workDir, "vault")
	v, err := vaultserver.Start(startCtx, b.opts.vault, dir)
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	defer func() { err = errors.Join(err, v.Stop()) }()
	if _, err := v.SetUpPKI(startCtx); err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	token, err := v.PolicyToken(startCtx, time.Hour)
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	tokenFile, config := filepath.Join(dir, "token"), filepath.Join(dir, "upstream.yaml")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return err
	}
	vaultURL, vaultCA, closeHTTPS, err := v.HTTPS() // the CA speaks https only
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	defer closeHTTPS()
	yaml := fmt.Sprintf("vault:\n  address: %s\n  caFile: %s\n  mount: pki\n  tokenFile: %s\n", vaultURL, vaultCA, tokenFile)
	if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
		return err
	}
	upstreamArgs := []string{"--ca-secret", "istio-system/workload-ca-bench-upstream", "--ca-upstream-config", config}

	window := max(3*time.Second, b.opts.duration/2)
	measure := func(args []string) func() (float64, float64, error) {
		return func() (float64, float64, error) {
			startCtx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			ca, err := b.startCA(startCtx, cp, "upstream", args...)
			if err != nil {
				return 0, 0, err
			}
			rate, failed, err := b.maxRateOf(ctx, cp, ca, plan, window)
			return rate, failed, errors.Join(err, ca.Stop())
		}
	}
	rates, errs, err := b.interleave("upstream", b.opts.upstreamRounds,
		arm{"local root", measure(nil)}, arm{"Vault intermediate", measure(upstreamArgs)})
	if err != nil {
		return err
	}
	b.recordComparison("upstream", "upstream_local_root_certs_per_sec", rates, errs, "local root", "Vault intermediate")
	return nil
}
