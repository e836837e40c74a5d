package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/workload-ca/workload-ca/internal/cli"
)

// TestConfigReferenceNamesEveryFlag: the reference has one row per serve
// flag, with its environment variable and default, and a usage text with
// a pipe does not break the table.
func TestConfigReferenceNamesEveryFlag(t *testing.T) {
	var b strings.Builder
	if err := writeConfigReference(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	fs, _ := serveFlags()
	n := 0
	fs.VisitAll(func(f *pflag.Flag) {
		n++
		row := "| `--" + f.Name + "` | `" + cli.EnvName(f.Name) + "` | "
		if !strings.Contains(out, row) {
			t.Errorf("no row for --%s (want %q)", f.Name, row)
		}
	})
	if rows := strings.Count(out, "\n| `--"); rows != n {
		t.Errorf("%d rows for %d flags", rows, n)
	}
	if got := cell("a|b\nc"); got != `a\|b c` {
		t.Errorf("cell = %q", got)
	}
}

func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		wantCode int
		want     string
	}{
		{[]string{"help"}, 0, "Usage:"},
		{[]string{"help", "serve"}, 0, "--trust-domain"},
		{[]string{"help", "serve"}, 0, "\nCA material:\n"},
		{[]string{"serve", "--help"}, 0, "\nLeader election:\n"},
		{[]string{"help", "request"}, 0, "--identity"},
		{[]string{"help", "config-reference"}, 0, "Markdown"},
		{[]string{"config-reference"}, 0, "| `--trust-domain` |"},
		{[]string{"help", "bogus"}, 2, `help "bogus": no such command`},
		{[]string{"serv"}, 2, `unknown command "serv" for "workload-ca"; did you mean serve?`},
		{[]string{"--version"}, 0, "workload-ca dev (commit "},
	} {
		var stdout, stderr strings.Builder
		code := run(t.Context(), tc.args, &stdout, &stderr)
		if code != tc.wantCode || !strings.Contains(stdout.String()+stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, output %q; want exit %d and %q", tc.args, code, stdout.String()+stderr.String(), tc.wantCode, tc.want)
		}
	}
}

func TestVersion(t *testing.T) {
	var stdout, stderr strings.Builder
	if code := run(t.Context(), []string{"version"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stdout.String()
	if !strings.HasPrefix(out, "workload-ca ") || !strings.Contains(out, "commit ") || !strings.Contains(out, "go1.") {
		t.Fatalf("version = %q; want version, commit and Go version", out)
	}
	b := build{version: "v1", revision: "abc", time: "2026-12-03T00:00:00Z", goVersion: "go1.26.8", modified: true}
	if got := b.String(); !strings.HasPrefix(got, "workload-ca v1 (commit abc-dirty, 2026-12-03T00:00:00Z, go1.26.8 ") {
		t.Errorf("String = %q", got)
	}
}
