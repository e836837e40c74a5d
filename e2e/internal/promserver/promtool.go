package promserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// CheckMetrics runs `promtool check metrics` (the linter Prometheus
// documents for exporters) on a scrape given on its standard input. It
// returns promtool's complaints, one per line (nil when it has none); err
// is set only when promtool could not judge (not found, a parse error).
func CheckMetrics(ctx context.Context, promtool string, scrape []byte) ([]string, error) {
	cmd := exec.CommandContext(ctx, promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(scrape)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var complaints []string
	for l := range strings.Lines(out.String()) {
		if l = strings.TrimSpace(l); l != "" {
			complaints = append(complaints, l)
		}
	}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return complaints, nil // promtool 2.x exits 0 with nothing to say
	case errors.As(err, &exitErr) && exitErr.ExitCode() == lintExitCode:
		return complaints, nil
	default:
		return complaints, fmt.Errorf("promtool check metrics: %w: %s", err, strings.Join(complaints, "; "))
	}
}

// lintExitCode is promtool's exit status for lint problems (1 is a
// failure to parse or run).
const lintExitCode = 3
