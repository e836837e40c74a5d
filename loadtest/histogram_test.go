package loadtest

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestHistogramExactBelow256us(t *testing.T) {
	var h Histogram
	for v := 1; v <= 200; v++ {
		h.Record(time.Duration(v) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 100}, {0.99, 198}, {0.995, 199}, {0.999, 200}, {1, 200}, {0.001, 1}} {
		if got := h.Quantile(c.q); got != c.want*time.Microsecond {
			t.Errorf("Quantile(%v) = %v, want %v", c.q, got, c.want*time.Microsecond)
		}
	}
	if h.Count() != 200 || h.Max() != 200*time.Microsecond || h.Mean() != 100*time.Microsecond {
		t.Errorf("count %d max %v mean %v", h.Count(), h.Max(), h.Mean())
	}
}

func TestHistogramPercentilesWithin1Percent(t *testing.T) {
	var h Histogram
	// 1ms..10s in 10,000 even steps, shuffled.
	vals := make([]time.Duration, 10_000)
	for i := range vals {
		vals[i] = time.Millisecond + time.Duration(i)*999*time.Microsecond
	}
	rand.Shuffle(len(vals), func(i, j int) { vals[i], vals[j] = vals[j], vals[i] })
	for _, v := range vals {
		h.Record(v)
	}
	for _, c := range []struct {
		q    float64
		rank int // 1-based nearest rank
	}{{0.5, 5000}, {0.9, 9000}, {0.99, 9900}, {0.999, 9990}} {
		want := time.Millisecond + time.Duration(c.rank-1)*999*time.Microsecond
		got := h.Quantile(c.q)
		if got < want || float64(got-want) > float64(want)/128 {
			t.Errorf("Quantile(%v) = %v, want %v (+ at most 1/128)", c.q, got, want)
		}
	}
	if got, want := h.Quantile(1), time.Millisecond+9999*999*time.Microsecond; got != want {
		t.Errorf("Quantile(1) = %v, want the maximum %v", got, want)
	}
}

func TestHistogramBuckets(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		v := r.Uint64() >> r.IntN(64)
		b := bucketOf(v)
		if b < 0 || b >= numBuckets {
			t.Fatalf("bucketOf(%d) = %d out of range", v, b)
		}
		hi := bucketHigh(b)
		if hi < v || float64(hi-v) > float64(v)/128 {
			t.Fatalf("value %d: bucket %d ends at %d", v, b, hi)
		}
		if b > 0 && bucketHigh(b-1) >= v {
			t.Fatalf("value %d also fits bucket %d", v, b-1)
		}
	}
}

func TestHistogramEmpty(t *testing.T) {
	var h Histogram
	if h.Quantile(0.99) != 0 || h.Mean() != 0 || h.Max() != 0 {
		t.Error("an empty histogram reports non-zero values")
	}
	h.Record(-time.Second)
	if h.Quantile(0.5) != 0 || h.Count() != 1 {
		t.Error("a negative duration does not count as zero")
	}
}
