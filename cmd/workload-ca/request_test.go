package main

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/workload-ca/workload-ca/internal/cli"
)

func TestParseRequestFlags(t *testing.T) {
	base := []string{"--root-cert", "/r.pem", "--token-file", "/t", "--identity", "spiffe://cluster.local/ns/demo/sa/web"}
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "valid", args: base},
		{name: "a word after a boolean flag is refused, not the rest dropped", args: append([]string{"--impersonate", "false", "--ttl", "1h"}, base...), wantErr: "unexpected arguments"},
		{name: "boolean flag with its value attached", args: append([]string{"--impersonate=false"}, base...)},
		{name: "identity required", args: []string{"--root-cert", "/r.pem", "--token-file", "/t"}, wantErr: "--identity"},
		{name: "bad output", args: append([]string{"--output", "yaml"}, base...), wantErr: "--output"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseRequestFlags(tt.args, io.Discard)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("parseRequestFlags() = %v", err)
				}
				if strings.Contains(tt.name, "attached") && c.Impersonate {
					t.Error("--impersonate=false not applied")
				}
				return
			}
			if err == nil || !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("parseRequestFlags() error = %v, want usage error mentioning %q", err, tt.wantErr)
			}
		})
	}
}
