// Package gcdefault is the garbage collector setting `workload-ca` runs
// with, shared with the benchmark that compares the server to the crypto
// floor (both must collect alike).
//
// The collector runs a fifth as often as Go's default unless GOGC is set:
// the CA's live heap is small (5 MiB serving a few thousand certificates
// per second, tens of MiB with a pod index of 150,000 pods) while its hot
// path allocates ~30 KB per certificate: at GOGC 200 it collected 8 times
// a second at 2,500 certificates per second. Each cycle scans every
// request's stack and shrinks the idle ones, which then grow again. The
// heap may reach five times the live heap; GOMEMLIMIT (the Helm chart sets
// it from the memory limit) makes the collector work harder before the
// limit.
package gcdefault

import (
	"os"
	"runtime/debug"
)

// Percent is the GOGC value used unless the environment sets one.
const Percent = 400

// Set sets the collector to Percent unless GOGC is set. It returns the
// previous setting and whether it changed it.
func Set() (previous int, changed bool) {
	if _, set := os.LookupEnv("GOGC"); set {
		return 0, false
	}
	return debug.SetGCPercent(Percent), true
}
