package main

import (
	"os"
	"testing"
	"time"
)

func TestParseBenchOutput(t *testing.T) {
	out := []byte(`goos: linux
BenchmarkIndexMemory/events-2         	       1	 389252660 ns/op	        63.72 heap-bytes/pod	    148473 node-sa-pairs
BenchmarkIndexRSS-16   	       1	 386094313 ns/op	        44.64 rss-MiB	        83.69 rss-bytes/pod
PASS
`)
	m := parseBenchOutput(out)
	if m["BenchmarkIndexMemory/events"]["heap-bytes/pod"] != 63.72 || m["BenchmarkIndexRSS"]["rss-bytes/pod"] != 83.69 ||
		m["BenchmarkIndexRSS"]["ns/op"] != 386094313 {
		t.Errorf("parsed %v", m)
	}
}

func TestSamplerInterpolates(t *testing.T) {
	t0 := time.Now()
	s := &sampler{all: []cpuSample{
		{at: t0, cpu: map[string]float64{"a": 10, "gone": 1}},
		{at: t0.Add(time.Second), cpu: map[string]float64{"a": 11, "gone": 2}},
		{at: t0.Add(2 * time.Second), cpu: map[string]float64{"a": 13}},
	}}
	cpu, cores := s.coresUsed("a", t0.Add(500*time.Millisecond), t0.Add(1500*time.Millisecond))
	if cpu != 1.5 || cores != 1.5 {
		t.Errorf("a: %v CPU seconds, %v cores; want 1.5 and 1.5", cpu, cores)
	}
	// An exited process is extrapolated over a short gap only.
	if cpu, _ := s.coresUsed("gone", t0, t0.Add(1100*time.Millisecond)); cpu < 1.09 || cpu > 1.11 {
		t.Errorf("gone: %v CPU seconds, want 1.1", cpu)
	}
	if cpu, cores := s.coresUsed("gone", t0, t0.Add(2*time.Second)); cpu != -1 || cores != -1 {
		t.Errorf("gone: a window the samples do not cover gave %v, %v", cpu, cores)
	}
}

func TestProcCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip(err)
	}
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); { // burn CPU
	}
	after, err := procCPU(os.Getpid())
	if err != nil || after < before {
		t.Errorf("CPU %v then %v, %v", before, after, err)
	}
}

func TestParseSteal(t *testing.T) {
	stat := []byte(`cpu  3392771 10343 600013 2331795 47788 0 47091 56231 0 0
cpu0 1687996 5287 287449 1203890 10245 0 21704 25841 0 0
cpu1 1704775 5056 312564 1127905 37542 0 25387 30390 0 0
intr 1 2 3
ctxt 99
`)
	got, err := parseSteal(stat)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != 258.41 || got[1] != 303.90 {
		t.Errorf("steal by CPU %v, want cpu0 258.41 s and cpu1 303.90 s", got)
	}
	if sum := sumSteal(got, []int{0, 1}); sum != 258.41+303.90 {
		t.Errorf("all CPUs: %v", sum)
	}
	if sum := sumSteal(got, []int{1}); sum != 303.90 {
		t.Errorf("cpu1: %v", sum)
	}
	for name, bad := range map[string]string{
		"no cpu lines":       "intr 1 2\n",
		"steal not a number": "cpu0 1 2 3 4 5 6 7 x 0 0\n",
	} {
		if _, err := parseSteal([]byte(bad)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
