package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/workload-ca/workload-ca/internal/cli"
)

// parse runs d's command line through cobra, the environment fallback and
// validation, as run does, and returns the configuration its work would
// get, without doing the work.
func parse[T any](d cli.Command[T], args []string) (T, error) {
	var got T
	d.Run = func(_ context.Context, c T, _, _ io.Writer) error {
		got = c
		return nil
	}
	cmd := d.Cobra(io.Discard, io.Discard)
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	err := cmd.Execute()
	return got, err
}

func parseServeFlags(args []string, _ io.Writer) (serveOptions, error) {
	return parse(serveCommand(), args)
}

func parseRequestFlags(args []string, _ io.Writer) (requestConfig, error) {
	return parse(requestCommand(), args)
}

func parseLoadtestFlags(args []string, _ io.Writer) (loadtestConfig, error) {
	return parse(loadtestCommand(), args)
}

// TestUsageErrorsExitTwoWithOneLineEach: every kind of bad command line
// exits 2 with one line per problem, naming the flag and showing a value
// that would do (or the command to ask), and never the whole usage.
func TestUsageErrorsExitTwoWithOneLineEach(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want []string // one per line, in order
	}{
		{"a duration without a unit", []string{"serve", "--ca-dir", dir, "--default-ttl", "5"},
			[]string{`"--default-ttl" flag: time: missing unit in duration "5" (--default-ttl wants a duration, e.g. --default-ttl=24h)`}},
		{"a number that is not one", []string{"serve", "--ca-dir", dir, "--kube-api-burst", "many"},
			[]string{"(--kube-api-burst wants a whole number, e.g. --kube-api-burst=100)"}},
		{"a flag without its value", []string{"serve", "--ca-dir"},
			[]string{"flag needs an argument: --ca-dir (e.g. --ca-dir=/etc/cacerts)"}},
		{"a mistyped flag", []string{"serve", "--ca-dri", dir},
			[]string{"unknown flag: --ca-dri (workload-ca serve --help lists the flags)"}},
		{"a mistyped command", []string{"serv"},
			[]string{`unknown command "serv" for "workload-ca"; did you mean serve? (workload-ca help lists the commands)`}},
		{"a stray word after a boolean flag", []string{"serve", "--ca-dir", dir, "--pprof", "false"},
			[]string{`unexpected arguments ["false"] (boolean flags take --flag=false)`}},
		{"no CA source", []string{"serve"},
			[]string{"exactly one of --ca-dir and --ca-secret is required (e.g. --ca-dir=/etc/cacerts)"}},
		{"two problems, two lines", []string{"serve", "--ca-dir", dir, "--ca-key-type", "ed25519", "--trust-domain", "Bad Domain"},
			[]string{`--ca-key-type: unknown key type "ed25519" (want`, "--trust-domain: ", "(e.g. --trust-domain=cluster.local)"}},
		{"a mistyped CA directory is not created", []string{"serve", "--ca-dir", filepath.Join(dir, "typo")},
			[]string{"does not exist (a mistyped path?); --ca-dir-create makes it"}},
		{"a bad value from the environment names the variable and the flag", []string{"request", "--identity", "spiffe://cluster.local/ns/a/sa/b", "--root-cert", "r", "--token-file", "t"},
			[]string{"WORKLOAD_CA_TTL (--ttl): ", "(--ttl wants a duration, e.g. --ttl=24h)"}},
		{"flags declared exclusive", []string{"loadtest", "--plan", "p", "--root-cert", "r", "--once", "--rate", "0"},
			[]string{"--once and --rate exclude each other: give one"}},
		{"an unknown help topic", []string{"help", "bogus"}, []string{`help "bogus": no such command`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.name, "environment") {
				t.Setenv("WORKLOAD_CA_TTL", "a day")
			}
			var stdout, stderr strings.Builder
			code := run(t.Context(), tc.args, &stdout, &stderr)
			lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
			if code != 2 || stdout.Len() != 0 {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 and nothing on stdout", code, stdout.String(), stderr.String())
			}
			wantLines := 1
			if strings.HasPrefix(tc.name, "two") {
				wantLines = 2
			}
			if len(lines) != wantLines {
				t.Fatalf("%d lines, want %d:\n%s", len(lines), wantLines, stderr.String())
			}
			for _, l := range lines {
				if !strings.HasPrefix(l, "workload-ca: ") {
					t.Errorf("line %q does not start with workload-ca:", l)
				}
			}
			got := stderr.String()
			for _, w := range tc.want {
				i := strings.Index(got, w)
				if i < 0 {
					t.Fatalf("stderr lacks %q:\n%s", w, stderr.String())
				}
				got = got[i+len(w):]
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "typo")); !os.IsNotExist(err) {
		t.Errorf("the mistyped --ca-dir was created: %v", err)
	}
}

// TestCompletion: the shells' scripts are generated, and completion offers
// the values of enumerated flags, the commands for help, and leaves out a
// flag declared exclusive with one already given.
func TestCompletion(t *testing.T) {
	complete := func(args ...string) []string {
		t.Helper()
		var stdout, stderr strings.Builder
		if code := run(t.Context(), append([]string{cobra.ShellCompRequestCmd}, args...), &stdout, &stderr); code != 0 {
			t.Fatalf("complete %q: exit %d: %s", args, code, stderr.String())
		}
		var words []string
		for _, l := range strings.Split(stdout.String(), "\n") {
			if l != "" && !strings.HasPrefix(l, ":") {
				w, _, _ := strings.Cut(l, "\t")
				words = append(words, w)
			}
		}
		return words
	}
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		var stdout, stderr strings.Builder
		if code := run(t.Context(), []string{"completion", shell}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "workload-ca") {
			t.Errorf("completion %s: exit %d, %d bytes: %s", shell, code, stdout.Len(), stderr.String())
		}
	}
	if got := complete("serve", "--log-format", ""); !slices.Equal(got, []string{"json", "text"}) {
		t.Errorf("--log-format completes to %q", got)
	}
	if got := complete("serve", "--ca-key-type", ""); !slices.Contains(got, "ecdsa-p256") || slices.Contains(got, "ed25519") {
		t.Errorf("--ca-key-type completes to %q", got)
	}
	if got := complete("help", "se"); !slices.Contains(got, "serve") {
		t.Errorf("help se completes to %q", got)
	}
	got := complete("serve", "--ca-dir", "/etc/cacerts", "--ca-")
	if !slices.Contains(got, "--ca-key-type") || slices.Contains(got, "--ca-secret") || slices.Contains(got, "--ca-root-dir") {
		t.Errorf("after --ca-dir, --ca- completes to %q; want --ca-key-type, and neither --ca-secret nor --ca-root-dir", got)
	}
}
