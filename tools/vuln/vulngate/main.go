// Command vulngate reads govulncheck's JSON output (-format json) on stdin
// and fails when the code calls a vulnerable function of a module it can
// upgrade. Vulnerabilities of the standard library are printed, not
// failed on: they are fixed by the Go release the project is built with,
// which the machine provides, not go.mod.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
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
	summaries := map[string]string{}
	called := map[string]string{} // osv id -> "module@version, fixed in"
	dec := json.NewDecoder(os.Stdin)
	for {
		var m message
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			fmt.Fprintln(os.Stderr, "vulngate: reading govulncheck output:", err)
			os.Exit(2)
		}
		if m.OSV != nil {
			summaries[m.OSV.ID] = m.OSV.Summary
		}
		if f := m.Finding; f != nil && len(f.Trace) > 0 && f.Trace[0].Function != "" {
			t := f.Trace[0]
			called[f.OSV] = fmt.Sprintf("%s@%s (fixed in %s)", t.Module, t.Version, f.FixedVersion)
		}
	}
	ids := make([]string, 0, len(called))
	for id := range called {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	failed := 0
	for _, id := range ids {
		where := called[id]
		if strings.HasPrefix(where, "stdlib@") {
			fmt.Printf("standard library, not failed on: %s %s: %s\n", id, where, summaries[id])
			continue
		}
		failed++
		fmt.Printf("VULNERABLE: %s %s: %s\n", id, where, summaries[id])
	}
	if failed > 0 {
		fmt.Printf("%d vulnerabilities the code calls, in modules go.mod can upgrade\n", failed)
		os.Exit(1)
	}
	fmt.Printf("no called vulnerability in a module (%d in the standard library)\n", len(ids))
}
