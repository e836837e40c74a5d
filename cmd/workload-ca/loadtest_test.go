package main

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/internal/cli"
)

func TestParseLoadtestFlags(t *testing.T) {
	c, err := parseLoadtestFlags([]string{"--plan", "p.json", "--root-cert", "r.pem", "--rate", "250", "--ztunnels-limit", "3", "--output", "json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.planFile != "p.json" || c.rootCert != "r.pem" || c.run.Rate != 250 || c.limit != 3 || !c.json ||
		c.run.Duration != 10*time.Second || c.run.Warmup != 3*time.Second || c.run.InFlight != 8 || c.run.Address != "localhost:15012" {
		t.Errorf("config = %+v", c)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no plan", []string{"--root-cert", "r.pem"}, "--plan and --root-cert are required"},
		{"bad output", []string{"--plan", "p", "--root-cert", "r", "--output", "yaml"}, "--output"},
		{"negative rate", []string{"--plan", "p", "--root-cert", "r", "--rate", "-1"}, "not negative"},
		{"zero in flight", []string{"--plan", "p", "--root-cert", "r", "--in-flight", "0"}, "must be positive"},
		{"once with rate", []string{"--plan", "p", "--root-cert", "r", "--once", "--rate", "5"}, "exclude each other"},
		{"stray argument", []string{"--plan", "p", "--root-cert", "r", "extra"}, "unexpected arguments"},
	} {
		_, err := parseLoadtestFlags(tc.args, io.Discard)
		if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want a usage error with %q", tc.name, err, tc.want)
		}
	}
}
