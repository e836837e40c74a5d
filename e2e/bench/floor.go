package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/internal/gcdefault"
)

var trustDomain = spiffeid.RequireTrustDomainFromString("cluster.local")

// floorResult is the crypto floor of one CA key type.
type floorResult struct {
	perCPUSecond float64 // certificates per second of process CPU
	perWallSec   float64 // certificates per second, one goroutine
	ops          int
}

// floorCSRs is how many distinct ztunnel-like CSRs the floor cycles through.
const floorCSRs = 64

// measureFloor runs what the server must do for every certificate, and
// nothing else, on one goroutine for about d: ParseCSR (PEM, DER, key
// check, CSR signature check, SAN check) and Authority.Sign (template,
// signature, parse and check of the leaf, PEM chain), with a CA generated
// as `serve` generates one (keystore.GenerateRoot of keyType). It reports
// certificates per second of process CPU (so garbage collection on other
// threads counts, and other processes on a busy machine do not) and per
// second of wall time.
func measureFloor(keyType string, d time.Duration) (floorResult, error) {
	// The same GC setting as `workload-ca serve`, so floor and server are
	// compared like with like.
	if previous, changed := gcdefault.Set(); changed {
		defer debug.SetGCPercent(previous)
	}
	m, err := keystore.GenerateRoot(keystore.GenerateOptions{TrustDomain: trustDomain, KeyType: keyType}, time.Now())
	if err != nil {
		return floorResult{}, err
	}
	a, err := ca.New(ca.Config{TrustDomain: trustDomain}, m)
	if err != nil {
		return floorResult{}, err
	}
	ids := make([]spiffeid.ID, floorCSRs)
	csrs := make([][]byte, floorCSRs)
	for i := range csrs {
		ids[i] = spiffeid.RequireFromPathf(trustDomain, "/ns/bench-%d/sa/app-%d", i%5, i)
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return floorResult{}, err
		}
		if csrs[i], err = caclient.NewCSR(key, ids[i]); err != nil {
			return floorResult{}, err
		}
	}
	ctx := context.Background()
	op := func(i int) error {
		csr, err := ca.ParseCSR(csrs[i%floorCSRs])
		if err != nil {
			return err
		}
		_, err = a.Sign(ctx, ca.Request{CSR: csr, ID: ids[i%floorCSRs]})
		return err
	}
	// Warm up (and check), then measure.
	for i := range 2 * floorCSRs {
		if err := op(i); err != nil {
			return floorResult{}, fmt.Errorf("floor %s: %w", keyType, err)
		}
	}
	runtime.GC()
	cpu0, err := processCPU()
	if err != nil {
		return floorResult{}, err
	}
	began := time.Now()
	n := 0
	for time.Since(began) < d {
		for range 16 {
			if err := op(n); err != nil {
				return floorResult{}, err
			}
			n++
		}
	}
	wall := time.Since(began)
	cpu1, err := processCPU()
	if err != nil {
		return floorResult{}, err
	}
	return floorResult{perCPUSecond: float64(n) / (cpu1 - cpu0).Seconds(), perWallSec: float64(n) / wall.Seconds(), ops: n}, nil
}

// processCPU returns the user and system CPU time of this process.
func processCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
