package main

import (
	"bytes"
	"strings"
	"testing"
)

const (
	osvNetHTTP = `{"osv":{"id":"GO-2026-0001","summary":"HPACK decoder crash in net/http"}}`
	osvYAML    = `{"osv":{"id":"GO-2026-0002","summary":"panic in a YAML parser"}}`
	// A standard-library function the code reaches.
	calledStdlib = `{"finding":{"osv":"GO-2026-0001","fixed_version":"v1.27.3","trace":[{"module":"stdlib","version":"v1.26.8","package":"net/http","function":"ServeHTTP"}]}}`
	// A module function the code reaches.
	calledModule = `{"finding":{"osv":"GO-2026-0002","fixed_version":"v1.2.3","trace":[{"module":"example.com/yaml","version":"v1.2.2","package":"example.com/yaml","function":"Unmarshal"}]}}`
	// Imported, but no vulnerable function reached.
	importedOnly = `{"finding":{"osv":"GO-2026-0002","fixed_version":"v1.2.3","trace":[{"module":"example.com/yaml","version":"v1.2.2","package":"example.com/yaml"}]}}`
	required     = `{"finding":{"osv":"GO-2026-0001","fixed_version":"v1.27.3","trace":[{"module":"stdlib","version":"v1.26.8"}]}}`
)

func TestGate(t *testing.T) {
	tests := []struct {
		name       string
		input      []string
		wantFailed bool
		wantOut    string
	}{
		{name: "a reachable standard library vulnerability fails", input: []string{osvNetHTTP, calledStdlib}, wantFailed: true,
			wantOut: "VULNERABLE: GO-2026-0001 stdlib@v1.26.8 (fixed in v1.27.3): HPACK decoder crash in net/http; raise GOTOOLCHAIN"},
		{name: "a reachable module vulnerability fails", input: []string{osvYAML, calledModule}, wantFailed: true,
			wantOut: "raise the module in go.mod"},
		{name: "both are counted", input: []string{osvNetHTTP, osvYAML, calledStdlib, calledModule}, wantFailed: true,
			wantOut: "2 vulnerabilities the code calls: 1 in modules, 1 in the standard library"},
		{name: "an imported package whose vulnerable function is not called passes", input: []string{osvYAML, importedOnly}, wantOut: "no vulnerability the code calls"},
		{name: "a required module not imported passes", input: []string{osvNetHTTP, required}, wantOut: "no vulnerability the code calls"},
		{name: "no findings pass", input: nil, wantOut: "no vulnerability the code calls"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			failed, err := gate(strings.NewReader(strings.Join(tt.input, "\n")), &out)
			if err != nil {
				t.Fatal(err)
			}
			if failed != tt.wantFailed {
				t.Errorf("failed = %v, want %v; output:\n%s", failed, tt.wantFailed, out.String())
			}
			if !strings.Contains(out.String(), tt.wantOut) {
				t.Errorf("output lacks %q:\n%s", tt.wantOut, out.String())
			}
		})
	}
}

func TestGateRefusesOutputItCannotRead(t *testing.T) {
	if _, err := gate(strings.NewReader(`{"finding":`), &bytes.Buffer{}); err == nil {
		t.Fatal("truncated govulncheck output was accepted")
	}
}
