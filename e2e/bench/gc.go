package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/workload-ca/workload-ca/e2e/internal/promserver"
)

// gcCounters are the CA's garbage collection counters at one time, from its
// /metrics.
type gcCounters struct {
	at     time.Time
	cycles float64 // completed collections: go_gc_duration_seconds_count
	cpu    float64 // go_cpu_classes_gc_total_cpu_seconds_total (the runtime's estimate)
}

// parseGCCounters reads the garbage collection counters from a scrape taken
// at.
func parseGCCounters(scrape []byte, at time.Time) (gcCounters, error) {
	samples, err := promserver.ParseText(scrape)
	if err != nil {
		return gcCounters{}, err
	}
	c := gcCounters{at: at}
	var n int
	if c.cycles, n = samples.Sum("go_gc_duration_seconds_count"); n != 1 {
		return gcCounters{}, errors.New("no go_gc_duration_seconds_count in the scrape")
	}
	if c.cpu, n = samples.Sum("go_cpu_classes_gc_total_cpu_seconds_total"); n != 1 {
		return gcCounters{}, errors.New("no go_cpu_classes_gc_total_cpu_seconds_total in the scrape")
	}
	return c, nil
}

// gcRates returns the collections per second between a and b, and the CPU
// milliseconds each took on average. ok is false when no time passed or no
// collection completed in between.
func gcRates(a, b gcCounters) (perSec, cpuMSEach float64, ok bool) {
	secs, cycles := b.at.Sub(a.at).Seconds(), b.cycles-a.cycles
	if secs <= 0 || cycles <= 0 {
		return 0, 0, false
	}
	return cycles / secs, 1000 * (b.cpu - a.cpu) / cycles, true
}

// scrapeGC reads the CA's garbage collection counters from its admin port.
func (b *bench) scrapeGC(ctx context.Context) (gcCounters, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.adminAddr+"/metrics", http.NoBody)
	if err != nil {
		return gcCounters{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return gcCounters{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return gcCounters{}, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return gcCounters{}, err
	}
	return parseGCCounters(body, time.Now())
}

// watchGC scrapes the CA's garbage collection counters once the load run's
// warm-up has passed (approximately, as fetchProfile: a second after it,
// the load generator taking time to prepare). The function it returns scrapes them again (call it when the
// load run ends), and returns the one that records the rates between the
// two scrapes as phase_gc_* and logs them.
func (b *bench) watchGC(ctx context.Context, phase string, warmup time.Duration) (end func() (record func())) {
	first := make(chan gcCounters, 1)
	go func() {
		defer close(first)
		select {
		case <-time.After(warmup + time.Second):
		case <-ctx.Done():
			return
		}
		if c, err := b.scrapeGC(ctx); err != nil {
			b.logf("  garbage collection counters: %v", err)
		} else {
			first <- c
		}
	}()
	return func() func() {
		a, ok := <-first
		if !ok {
			return func() {}
		}
		c, err := b.scrapeGC(ctx)
		return func() {
			if err != nil {
				b.logf("  garbage collection counters: %v", err)
				return
			}
			perSec, cpuMS, ok := gcRates(a, c)
			if !ok {
				b.logf("  garbage collection: no cycle completed")
				return
			}
			b.res.set(phase+"_gc_cycles_per_sec", perSec)
			b.res.set(phase+"_gc_cpu_ms_per_cycle", cpuMS)
			b.logf("  garbage collection: %.1f cycles/s, %.1f ms of CPU each (the Go runtime's estimate)", perSec, cpuMS)
		}
	}
}
