package promserver

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// Sample is one line of a scrape: a metric name, its labels and its value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Samples is a parsed scrape.
type Samples []Sample

// ParseText parses the Prometheus text exposition format (version 0.0.4):
// comments are skipped, label values unescaped (\\, \" and \n), and a
// trailing timestamp ignored.
func ParseText(b []byte) (Samples, error) {
	var out Samples
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d %q: %w", n, line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseLine(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return s, fmt.Errorf("no value")
	}
	s.Name, line = line[:i], line[i:]
	if line[0] == '{' {
		var err error
		if line, err = parseLabels(line[1:], s.Labels); err != nil {
			return s, err
		}
	}
	fields := strings.Fields(line)
	if len(fields) < 1 || len(fields) > 2 {
		return s, fmt.Errorf("want a value and an optional timestamp, got %q", line)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, err
	}
	s.Value = v
	return s, nil
}

// parseLabels reads `name="value",...}` into labels and returns what
// follows the closing brace.
func parseLabels(in string, labels map[string]string) (string, error) {
	for {
		in = strings.TrimLeft(in, " \t")
		if strings.HasPrefix(in, "}") {
			return in[1:], nil
		}
		eq := strings.IndexByte(in, '=')
		if eq <= 0 || len(in) < eq+2 || in[eq+1] != '"' {
			return "", fmt.Errorf("bad label at %q", in)
		}
		name := strings.TrimSpace(in[:eq])
		in = in[eq+2:]
		var v strings.Builder
		closed := false
		for len(in) > 0 && !closed {
			c := in[0]
			in = in[1:]
			switch {
			case c == '"':
				closed = true
			case c == '\\' && len(in) > 0:
				switch in[0] {
				case 'n':
					v.WriteByte('\n')
				default: // \\ and \"
					v.WriteByte(in[0])
				}
				in = in[1:]
			default:
				v.WriteByte(c)
			}
		}
		if !closed {
			return "", fmt.Errorf("unterminated value of label %s", name)
		}
		if _, dup := labels[name]; dup {
			return "", fmt.Errorf("label %s twice", name)
		}
		labels[name] = v.String()
		in = strings.TrimPrefix(strings.TrimLeft(in, " \t"), ",")
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
