package podindex

import (
	"bufio"
	"bytes"
	"errors"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"
)

// BenchmarkIndexRSS loads 150,000 pods over 5,000 nodes into the store, one
// watch event at a time, and reports the resident set size of the process
// with the index loaded (VmRSS after a GC that returns freed memory to the
// OS) and its growth per pod. Run it alone in its own process
// (-bench '^BenchmarkIndexRSS$'): memory that earlier benchmarks freed may
// otherwise still count. Linux only.
func BenchmarkIndexRSS(b *testing.B) {
	const pods, nodes, namespaces = 150_000, 5_000, 500
	if _, err := vmRSS(); err != nil {
		b.Skip(err)
	}
	var before, after uint64
	for b.Loop() {
		debug.FreeOSMemory()
		var err error
		if before, err = vmRSS(); err != nil {
			b.Fatal(err)
		}
		c := newCluster(pods, nodes, namespaces)
		s := newStore(slog.New(slog.DiscardHandler))
		for i := range pods {
			if err := s.Add(c.pod(i)); err != nil {
				b.Fatal(err)
			}
		}
		debug.FreeOSMemory()
		if after, err = vmRSS(); err != nil {
			b.Fatal(err)
		}
		runtime.KeepAlive(s)
	}
	b.ReportMetric(float64(after)/(1<<20), "rss-MiB")
	b.ReportMetric(float64(after-before)/pods, "rss-bytes/pod")
}

// vmRSS returns the resident set size of this process in bytes.
func vmRSS() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmRSS:")); ok {
			kb, err := strconv.ParseUint(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
			return kb << 10, err
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("/proc/self/status: no VmRSS line")
}
