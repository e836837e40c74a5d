package cahost

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
)

func TestParseRefusal(t *testing.T) {
	tests := []struct {
		name     string
		stderr   string
		wantCode codes.Code
		wantMsg  string
		wantNil  bool
	}{
		{"permission denied", "workload-ca: request refused: code=PermissionDenied message=\"identity not permitted: not_on_node\"\n",
			codes.PermissionDenied, "identity not permitted: not_on_node", false},
		{"unauthenticated after other output", "some warning\nworkload-ca: request refused: code=Unauthenticated message=\"authentication failed\"\n",
			codes.Unauthenticated, "authentication failed", false},
		{"quoted characters", `workload-ca: request refused: code=InvalidArgument message="bad \"csr\": x"`,
			codes.InvalidArgument, `bad "csr": x`, false},
		{"unknown code name", `workload-ca: request refused: code=Bogus message="m"`, codes.Unknown, "m", false},
		{"not a refusal", "workload-ca: --token-file: open x: no such file or directory\n", 0, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := parseRefusal([]byte(tc.stderr))
			if tc.wantNil {
				if got != nil {
					t.Fatalf("parseRefusal = %v, want nil", got)
				}
				return
			}
			if got == nil || got.Code != tc.wantCode || got.Message != tc.wantMsg {
				t.Fatalf("parseRefusal = %+v, want code %s message %q", got, tc.wantCode, tc.wantMsg)
			}
		})
	}
}

func TestCode(t *testing.T) {
	wrapped := fmt.Errorf("ctx: %w", &RefusedError{Code: codes.PermissionDenied})
	for err, want := range map[error]codes.Code{
		nil:                   codes.OK,
		wrapped:               codes.PermissionDenied,
		errors.New("crashed"): codes.Unknown,
	} {
		if got := Code(err); got != want {
			t.Errorf("Code(%v) = %s, want %s", err, got, want)
		}
	}
}

func TestCodeByNameCoversEveryCode(t *testing.T) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if got := codeByName(c.String()); got != c {
			t.Errorf("codeByName(%q) = %s", c.String(), got)
		}
	}
}
