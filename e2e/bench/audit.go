package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"math"
	"os"
	"slices"
	"time"
)

// handlingTimes reads the CA's audit log at path and returns, for the
// requests answered in [from, to), the time the service itself took (the
// record's "took_seconds": from the handler's start to its answer, without the
// transport, the network or the client), sorted.
func handlingTimes(path string, from, to time.Time) ([]time.Duration, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var took []time.Duration
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var rec struct {
			Time time.Time `json:"time"`
			Took *float64  `json:"took_seconds"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, err
		}
		// Summaries of refusals are records of no one request.
		if rec.Took != nil && !rec.Time.Before(from) && rec.Time.Before(to) {
			took = append(took, time.Duration(math.Round(*rec.Took*float64(time.Second))))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(took) == 0 {
		return nil, errors.New("no audit record in the window")
	}
	slices.Sort(took)
	return took, nil
}

// quantile returns the q-quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
