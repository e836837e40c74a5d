package issuance

import (
	"testing"
	"unicode/utf8"
)

// Clip keeps short strings, and cuts long ones in whole UTF-8 characters,
// saying how long they were.
func TestClip(t *testing.T) {
	tests := []struct {
		name, in string
		n        int
		want     string
	}{
		{"short", "east", 8, "east"},
		{"exactly the bound", "east", 4, "east"},
		{"long", "eastern", 4, "east…[cut: 7 bytes]"},
		{"not inside a character", "ab" + "é" + "cd", 3, "ab…[cut: 6 bytes]"},
		{"empty bound", "east", 0, "…[cut: 4 bytes]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Clip(tt.in, tt.n); got != tt.want || !utf8.ValidString(got) {
				t.Errorf("Clip(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
			}
		})
	}
}
