// Command vulngate reads govulncheck's JSON output (-format json) on stdin
// and fails when the code calls a vulnerable function, in a module go.mod
// can upgrade or in the standard library. The standard library's fixes
// come with the Go release the project builds with: the Makefile pins it
// (GOTOOLCHAIN), so a vulnerability there is fixed by raising that pin.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
)

type message struct {
	OSV *struct {
		ID      string `json:"id"`
		Summary string `json:"summary"`
	} `json:"osv"`
	Finding *struct {
		OSV          string `json:"osv"`
		FixedVersion string `json:"fixed_version"`
		Trace        []struct {
			Module   string `json:"module"`
			Version  string `json:"version"`
			Package  string `json:"package"`
			Function string `json:"function"`
		} `json:"trace"`
	} `json:"finding"`
}

func main() {
	failed, err := gate(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vulngate:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// gate reads govulncheck's messages from r and writes one line per
// vulnerability the code calls to w, then a summary; failed says that
// there was at least one.
func gate(r io.Reader, w io.Writer) (failed bool, err error) {
	summaries := map[string]string{}
	called := map[string]string{} // osv id -> "module@version (fixed in ...)"
	dec := json.NewDecoder(r)
	for {
		var m message
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return false, fmt.Errorf("reading govulncheck output: %w", err)
		}
		if m.OSV != nil {
			summaries[m.OSV.ID] = m.OSV.Summary
		}
		// A finding whose innermost frame names a function is one the
		// code reaches; the others only import or require it.
		if f := m.Finding; f != nil && len(f.Trace) > 0 && f.Trace[0].Function != "" {
			t := f.Trace[0]
			called[f.OSV] = fmt.Sprintf("%s@%s (fixed in %s)", t.Module, t.Version, f.FixedVersion)
		}
	}
	var stdlib, modules int
	for _, id := range slices.Sorted(maps.Keys(called)) {
		where := called[id]
		fix := "raise the module in go.mod"
		if strings.HasPrefix(where, "stdlib@") || strings.HasPrefix(where, "toolchain@") {
			stdlib++
			fix = "raise GOTOOLCHAIN in the Makefile and .ci/run"
		} else {
			modules++
		}
		fmt.Fprintf(w, "VULNERABLE: %s %s: %s; %s\n", id, where, summaries[id], fix)
	}
	if len(called) > 0 {
		fmt.Fprintf(w, "%d vulnerabilities the code calls: %d in modules, %d in the standard library\n", len(called), modules, stdlib)
		return true, nil
	}
	fmt.Fprintln(w, "no vulnerability the code calls")
	return false, nil
}
