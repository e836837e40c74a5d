package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// procCPU returns the CPU seconds (user + system, all threads) that
// process pid has used, from /proc/<pid>/stat.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state): utime and stime are fields 14 and 15.
	utime, err1 := strconv.ParseUint(string(f[11]), 10, 64)
	stime, err2 := strconv.ParseUint(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return float64(utime+stime) / clockTicks, nil
}

// stealByCPU returns, per CPU, the seconds the hypervisor ran something
// else while this machine's CPU had work (steal, from /proc/stat).
func stealByCPU() (map[int]float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, err
	}
	return parseSteal(b)
}

// parseSteal reads the steal field (the eighth number) of each cpuN line
// of /proc/stat.
func parseSteal(stat []byte) (map[int]float64, error) {
	out := map[int]float64{}
	for line := range bytes.Lines(stat) {
		f := bytes.Fields(line)
		if len(f) < 9 || !bytes.HasPrefix(f[0], []byte("cpu")) || len(f[0]) == 3 {
			continue
		}
		cpu, err1 := strconv.Atoi(string(f[0][3:]))
		steal, err2 := strconv.ParseUint(string(f[8]), 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("/proc/stat: bad line %q", bytes.TrimSpace(line))
		}
		out[cpu] = float64(steal) / clockTicks
	}
	if len(out) == 0 {
		return nil, errors.New("/proc/stat: no cpuN lines")
	}
	return out, nil
}

// cpuSample is the CPU seconds of several processes at one time.
type cpuSample struct {
	at  time.Time
	cpu map[string]float64
}

// sampler reads the CPU time of named processes every sampleInterval, so that the
// CPU used in a window known only afterwards (the load generator's measured
// window) can be interpolated. It also reads the steal of named sets of
// CPUs, as if each were a process.
type sampler struct {
	pids  map[string]int
	steal map[string][]int
	mu    sync.Mutex
	all   []cpuSample
	stop  chan struct{}
	done  chan struct{}
}

// sampleInterval is how often the sampler reads /proc.
const sampleInterval = 100 * time.Millisecond

func startSampler(pids map[string]int, steal map[string][]int) *sampler {
	s := &sampler{pids: pids, steal: steal, stop: make(chan struct{}), done: make(chan struct{})}
	s.sample()
	go func() {
		defer close(s.done)
		t := time.NewTicker(sampleInterval)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				s.sample()
				return
			case <-t.C:
				s.sample()
			}
		}
	}()
	return s
}

func (s *sampler) sample() {
	c := cpuSample{at: time.Now(), cpu: map[string]float64{}}
	for name, pid := range s.pids {
		if v, err := procCPU(pid); err == nil {
			c.cpu[name] = v
		}
	}
	if len(s.steal) > 0 {
		if byCPU, err := stealByCPU(); err == nil {
			for name, cpus := range s.steal {
				c.cpu[name] = sumSteal(byCPU, cpus)
			}
		}
	}
	s.mu.Lock()
	s.all = append(s.all, c)
	s.mu.Unlock()
}

// sumSteal adds the steal of cpus.
func sumSteal(byCPU map[int]float64, cpus []int) float64 {
	var sum float64
	for _, c := range cpus {
		sum += byCPU[c]
	}
	return sum
}

// Stop takes a last sample and stops.
func (s *sampler) Stop() {
	close(s.stop)
	<-s.done
}

// coresUsed returns the CPU seconds name used between from and to, linearly
// interpolated between samples, divided by the wall time: the number of
// cores it kept busy. It is -1 when the samples do not cover the window.
func (s *sampler) coresUsed(name string, from, to time.Time) (cpuSeconds, cores float64) {
	a, okA := s.at(name, from)
	b, okB := s.at(name, to)
	if !okA || !okB || !to.After(from) {
		return -1, -1
	}
	return b - a, (b - a) / to.Sub(from).Seconds()
}

func (s *sampler) at(name string, t time.Time) (float64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pts []cpuSample // the samples that have name
	for _, c := range s.all {
		if _, ok := c.cpu[name]; ok {
			pts = append(pts, c)
		}
	}
	for i := 1; i < len(pts); i++ {
		p, q := pts[i-1], pts[i]
		if t.Before(p.at) || t.After(q.at) {
			continue
		}
		return interpolate(p, q, name, t), true
	}
	// A process that exited just after the window (the load generator) has
	// no sample after it: extrapolate its last rate over a short gap.
	if n := len(pts); n >= 2 && t.After(pts[n-1].at) && t.Sub(pts[n-1].at) <= 3*sampleInterval {
		return interpolate(pts[n-2], pts[n-1], name, t), true
	}
	return 0, false
}

func interpolate(p, q cpuSample, name string, t time.Time) float64 {
	pv, qv := p.cpu[name], q.cpu[name]
	span := q.at.Sub(p.at).Seconds()
	if span <= 0 {
		return pv
	}
	return pv + (qv-pv)*t.Sub(p.at).Seconds()/span
}
