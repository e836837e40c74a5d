package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// measurePodIndex builds the pod index benchmarks once and runs
// BenchmarkIndexMemory (heap kept per pod, events and relist) and
// BenchmarkIndexRSS (resident set with the index loaded) each in a fresh
// process.
func (b *bench) measurePodIndex(ctx context.Context) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "workload-ca-bench-podindex-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "podindex.test")
	goCmd := cmp.Or(os.Getenv("GO"), "go")
	build := exec.CommandContext(ctx, goCmd, "test", "-c", "-o", bin, "./authz/podindex/")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building the pod index benchmarks: %w\n%s", err, out)
	}
	metrics := map[string]map[string]float64{}
	for _, bench := range []string{"^BenchmarkIndexMemory$", "^BenchmarkIndexRSS$"} {
		cmd := exec.CommandContext(ctx, bin, "-test.run", "^$", "-test.bench", bench, "-test.benchtime", "1x")
		cmd.Dir = filepath.Join(root, "authz", "podindex")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %w\n%s", bench, err, out)
		}
		for name, m := range parseBenchOutput(out) {
			metrics[name] = m
		}
	}
	get := func(bench, unit string) (float64, error) {
		v, ok := metrics[bench][unit]
		if !ok {
			return 0, fmt.Errorf("pod index benchmarks: no %s in %s (got %v)", unit, bench, metrics)
		}
		return v, nil
	}
	var errs []error
	for _, m := range []struct{ key, bench, unit string }{
		{"podindex_bytes_per_pod", "BenchmarkIndexMemory/events", "heap-bytes/pod"},
		{"podindex_relist_bytes_per_pod", "BenchmarkIndexMemory/relist", "heap-bytes/pod"},
		{"podindex_rss_mib", "BenchmarkIndexRSS", "rss-MiB"},
		{"podindex_rss_bytes_per_pod", "BenchmarkIndexRSS", "rss-bytes/pod"},
	} {
		v, err := get(m.bench, m.unit)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		b.res.set(m.key, v)
	}
	b.logf("  heap %.1f B/pod (relist %.1f), RSS with the index loaded %.1f MiB (%.1f B/pod over the empty process)",
		metrics["BenchmarkIndexMemory/events"]["heap-bytes/pod"], metrics["BenchmarkIndexMemory/relist"]["heap-bytes/pod"],
		metrics["BenchmarkIndexRSS"]["rss-MiB"], metrics["BenchmarkIndexRSS"]["rss-bytes/pod"])
	return errors.Join(errs...)
}

// parseBenchOutput returns the metrics of each benchmark line of `go test
// -bench` output, by benchmark name without the -GOMAXPROCS suffix and by
// unit: "BenchmarkX/sub-2  1  123 ns/op  45.6 heap-bytes/pod".
func parseBenchOutput(out []byte) map[string]map[string]float64 {
	res := map[string]map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		m := map[string]float64{}
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				m[f[i+1]] = v
			}
		}
		res[name] = m
	}
	return res
}

// moduleRoot finds the directory of the workload-ca go.mod from the working
// directory up.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module github.com/workload-ca/workload-ca\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("bench: run it inside the workload-ca repository (no go.mod of github.com/workload-ca/workload-ca above the working directory)")
		}
		dir = parent
	}
}
