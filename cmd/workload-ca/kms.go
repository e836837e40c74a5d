package main

import (
	"context"
	"crypto"

	"github.com/workload-ca/workload-ca/ca/keystore"
	// The KMS types --ca-key-uri accepts.
	_ "github.com/workload-ca/workload-ca/ca/keystore/kmstypes"
)

// openCAKey opens the key of --ca-key-uri, once for the life of the
// process: the directory it belongs to may be reloaded, the key is not.
func (a *app) openCAKey(ctx context.Context) error {
	if a.cfg.CAKeyURI == "" {
		return nil
	}
	k, err := keystore.OpenKey(ctx, a.cfg.CAKeyURI)
	if err != nil {
		return err
	}
	a.caKey = k
	a.log.Info("CA key opened", "uri", k.URI, "algorithm", k.Algorithm())
	return nil
}

func (a *app) closeCAKey() {
	if a.caKey == nil {
		return
	}
	if err := a.caKey.Close(); err != nil {
		a.log.Warn("closing the CA key", "uri", a.caKey.URI, "error", err.Error())
	}
}

// caKeySigner is the --ca-key-uri key as the keystore loaders take it:
// nil when the key is a file in the directory.
func (a *app) caKeySigner() crypto.Signer {
	if a.caKey == nil {
		return nil
	}
	return a.caKey
}

// kmsSigns is --max-concurrent-signs by default when a KMS or HSM key
// signs every leaf (--ca-key-uri with --ca-dir): a signature then waits on
// the KMS, not on our CPU, and slots sized to the CPUs would bound the
// rate to CPUs / round trip (a 2-CPU CA on a KMS 50 ms away: 40
// certificates a second). 64 slots allow 1,280.
const kmsSigns = 64

// signsDefault is the --max-concurrent-signs default for c: kmsSigns when
// a KMS key (not a file through softkms) signs leaves, else 0, which the
// server reads as the number of CPUs.
func signsDefault(c *serveConfig) int {
	if c.CADir != "" && keystore.SignsRemotely(c.CAKeyURI) {
		return kmsSigns
	}
	return 0
}
