package promserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one line of a scrape: a metric name, its labels and its value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Samples is a parsed scrape.
type Samples []Sample

// Scrape fetches and parses http://addr/metrics, giving up after 5s.
func Scrape(ctx context.Context, addr string) (Samples, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", http.NoBody)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	return ParseText(body)
}

// ParseText parses the Prometheus text exposition format with
// prometheus/common's parser and flattens it into one sample per line as
// the format prints it: histograms as _bucket (with le), _sum and _count;
// summaries as quantiles, _sum and _count.
func ParseText(b []byte) (Samples, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	var out Samples
	for name, f := range families {
		for _, m := range f.GetMetric() {
			out = append(out, flatten(name, f.GetType(), m)...)
		}
	}
	return out, nil
}

// flatten returns the samples of one metric of a family.
func flatten(name string, typ dto.MetricType, m *dto.Metric) Samples {
	labels := func(extra ...string) map[string]string {
		l := make(map[string]string, len(m.GetLabel())+1)
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		for i := 0; i+1 < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
		}
		return l
	}
	switch typ {
	case dto.MetricType_COUNTER:
		return Samples{{Name: name, Labels: labels(), Value: m.GetCounter().GetValue()}}
	case dto.MetricType_GAUGE:
		return Samples{{Name: name, Labels: labels(), Value: m.GetGauge().GetValue()}}
	case dto.MetricType_HISTOGRAM:
		h := m.GetHistogram()
		out := Samples{{Name: name + "_sum", Labels: labels(), Value: h.GetSampleSum()},
			{Name: name + "_count", Labels: labels(), Value: float64(h.GetSampleCount())}}
		for _, b := range h.GetBucket() {
			le := strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)
			out = append(out, Sample{Name: name + "_bucket", Labels: labels("le", le), Value: float64(b.GetCumulativeCount())})
		}
		return append(out, Sample{Name: name + "_bucket", Labels: labels("le", "+Inf"), Value: float64(h.GetSampleCount())})
	case dto.MetricType_SUMMARY:
		sm := m.GetSummary()
		out := Samples{{Name: name + "_sum", Labels: labels(), Value: sm.GetSampleSum()},
			{Name: name + "_count", Labels: labels(), Value: float64(sm.GetSampleCount())}}
		for _, q := range sm.GetQuantile() {
			out = append(out, Sample{Name: name, Labels: labels("quantile", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)), Value: q.GetValue()})
		}
		return out
	default:
		return Samples{{Name: name, Labels: labels(), Value: m.GetUntyped().GetValue()}}
	}
}

// Match returns the samples named name whose labels include every pair of
// labelPairs ("key", "value", ...).
func (ss Samples) Match(name string, labelPairs ...string) Samples {
	var out Samples
	for _, s := range ss {
		if s.Name == name && hasLabels(s.Labels, labelPairs) {
			out = append(out, s)
		}
	}
	return out
}

// Sum returns the sum of Match's values and how many samples matched.
func (ss Samples) Sum(name string, labelPairs ...string) (float64, int) {
	m := ss.Match(name, labelPairs...)
	var sum float64
	for _, s := range m {
		sum += s.Value
	}
	return sum, len(m)
}

func hasLabels(labels map[string]string, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		if v, ok := labels[pairs[i]]; !ok || v != pairs[i+1] {
			return false
		}
	}
	return true
}
