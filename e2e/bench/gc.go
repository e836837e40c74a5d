package main

import (
	"context"
	"errors"
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

// gcCountersOf reads the garbage collection counters from a scrape taken
// at.
func gcCountersOf(samples promserver.Samples, at time.Time) (gcCounters, error) {
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
	samples, err := promserver.Scrape(ctx, b.adminAddr)
	if err != nil {
		return gcCounters{}, err
	}
	return gcCountersOf(samples, time.Now())
}

// gcWatch measures the CA's collections over a load run: from a scrape
// after the warm-up to one at the end.
type gcWatch struct {
	first    chan gcCounters // closed without a value when the first scrape failed (it logs why)
	from, to gcCounters
	ok       bool // both scrapes done
}

// watchGC scrapes the CA's garbage collection counters once the load run's
// warm-up has passed (approximately, as fetchProfile: a second after it,
// the load generator taking time to prepare). Call stopGC when the run ends,
// then recordGC.
func (b *bench) watchGC(ctx context.Context, warmup time.Duration) *gcWatch {
	w := &gcWatch{first: make(chan gcCounters, 1)}
	go func() {
		defer close(w.first)
		select {
		case <-time.After(warmup + time.Second):
		case <-ctx.Done():
			return
		}
		if c, err := b.scrapeGC(ctx); err != nil {
			b.logf("  garbage collection counters: %v", err)
		} else {
			w.first <- c
		}
	}()
	return w
}

// stopGC scrapes the counters again, once the first scrape is done.
func (b *bench) stopGC(ctx context.Context, w *gcWatch) {
	from, ok := <-w.first
	if !ok {
		return
	}
	to, err := b.scrapeGC(ctx)
	if err != nil {
		b.logf("  garbage collection counters: %v", err)
		return
	}
	w.from, w.to, w.ok = from, to, true
}

// recordGC records the rates between the two scrapes as phase_gc_* and
// logs them.
func (b *bench) recordGC(phase string, w *gcWatch) {
	if !w.ok {
		return
	}
	perSec, cpuMS, ok := gcRates(w.from, w.to)
	if !ok {
		b.logf("  garbage collection: no cycle completed")
		return
	}
	b.res.set(phase+"_gc_cycles_per_sec", perSec)
	b.res.set(phase+"_gc_cpu_ms_per_cycle", cpuMS)
	b.logf("  garbage collection: %.1f cycles/s, %.1f ms of CPU each (the Go runtime's estimate)", perSec, cpuMS)
}
