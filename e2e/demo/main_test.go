package main

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/e2e/cahost"
)

// TestDemoExit runs the demo as `go run ./e2e/demo --exit` would and checks
// what it prints and that it cleans up after itself.
func TestDemoExit(t *testing.T) {
	if v := cahost.MissingEnv(); v != "" {
		t.Skipf("%s is unset: run `make e2e`", v)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, []string{"--exit"}, &out); err != nil {
		t.Fatalf("demo: %v\noutput:\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"spiffe://cluster.local/ns/demo/sa/web\n    serial",
		"spiffe://cluster.local/ns/demo/sa/db\n    serial",
		"refused    PermissionDenied",
		"request --addr 127.0.0.1:",
		"Stopping (--exit).",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	m := regexp.MustCompile(`(?m)^  kubeconfig\s+(\S+)$`).FindStringSubmatch(got)
	if m == nil {
		t.Fatalf("no kubeconfig path in the output:\n%s", got)
	}
	if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
		t.Errorf("%s still exists after the demo stopped (err %v)", m[1], err)
	}
}
