package tokenreview

import (
	"strings"
	"testing"
)

func TestCheckTokenShape(t *testing.T) {
	valid := makeJWT(t, map[string]any{"exp": 1})
	tests := []struct {
		name    string
		token   string
		wantErr string
	}{
		{"jwt", valid, ""},
		{"padded segments", "eyJh==.eyJi=.c2ln", ""},
		{"empty", "", "empty bearer token"},
		{"one segment", "abc", "want 3 non-empty segments, got 1"},
		{"two segments", "abc.def", "got 2"},
		{"four segments", "a.b.c.d", "got 4"},
		{"empty header", ".b.c", "empty segment 1"},
		{"empty payload", "a..c", "empty segment 2"},
		{"empty signature", "a.b.", "want 3 non-empty segments"},
		{"space", "a.b c.d", "unexpected byte at offset 3"},
		{"standard base64", "a+/.b.c", "unexpected byte at offset 1"},
		{"padding inside segment", "a=b.c.d", "unexpected byte at offset 2"},
		{"padding only", "=.b.c", "unexpected byte at offset 0"},
		{"bearer prefix", "Bearer " + valid, "unexpected byte at offset 6"},
		{"trailing newline", valid + "\n", "unexpected byte"},
		{"too large", strings.Repeat("a", maxTokenSize-3) + ".b.c", "exceeds 8192"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkTokenShape(tc.token)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("checkTokenShape: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("checkTokenShape error = %v, want containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestTokenExpiry(t *testing.T) {
	withPayload := func(p string) string { return "eyJhbGciOiJSUzI1NiJ9." + p + ".c2ln" }
	tests := []struct {
		name   string
		token  string
		want   int64
		wantOK bool
	}{
		{"integer exp", makeJWT(t, map[string]any{"exp": 1893456000}), 1893456000, true},
		{"fractional exp truncates", makeJWT(t, map[string]any{"exp": 1893456000.9}), 1893456000, true},
		{"exponent form", withPayload(b64(`{"exp":1.8e9}`)), 1800000000, true},
		{"padded payload", withPayload(b64(`{"exp":12}`) + "=="), 12, true},
		{"last duplicate wins", withPayload(b64(`{"exp":1,"exp":2}`)), 2, true},
		{"largest allowed", makeJWT(t, map[string]any{"exp": maxExpiry}), maxExpiry, true},
		{"beyond year 9999", makeJWT(t, map[string]any{"exp": maxExpiry + 1}), 0, false},
		{"no exp", makeJWT(t, map[string]any{"sub": "x"}), 0, false},
		{"exp as string", makeJWT(t, map[string]any{"exp": "1893456000"}), 0, false},
		{"exp null", withPayload(b64(`{"exp":null}`)), 0, false},
		{"exp zero", makeJWT(t, map[string]any{"exp": 0}), 0, false},
		{"exp negative", makeJWT(t, map[string]any{"exp": -5}), 0, false},
		{"exp overflows float", withPayload(b64(`{"exp":1e999}`)), 0, false},
		{"exp upper case", withPayload(b64(`{"EXP":1893456000}`)), 0, false},
		{"exp nested", withPayload(b64(`{"claims":{"exp":1893456000}}`)), 0, false},
		{"payload not json", withPayload(b64(`exp=1`)), 0, false},
		{"payload json array", withPayload(b64(`[1]`)), 0, false},
		{"payload not base64url", withPayload("e+/="), 0, false},
		{"two segments", "a.b", 0, false},
		{"empty", "", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tokenExpiry(tc.token)
			if ok != tc.wantOK || (ok && got.Unix() != tc.want) {
				t.Fatalf("tokenExpiry = %v (unix %d), %v; want unix %d, %v", got, got.Unix(), ok, tc.want, tc.wantOK)
			}
		})
	}
}

// FuzzTokenExpiry checks that the unverified exp decoder never panics and
// stays in range, whether the input is the whole token or its decoded
// payload, and that it reads back the exp of any token we build, whatever
// the other claims hold.
func FuzzTokenExpiry(f *testing.F) {
	for _, seed := range []string{
		"", ".", "..", "a.b.c", "a.b", `{"exp":1893456000}`, `{"exp":1.5}`, `{"exp":"1"}`, `{"exp":-1}`,
		`{"exp":1e999}`, `{"exp":null}`, `{"exp":1,"exp":2}`, `{"EXP":3}`, `[]`, `"exp"`, `{`,
		`{"exp":253402300800}`, "eyJ.eyJleHAiOjF9.", makeJWT(f, map[string]any{"exp": 1893456000}),
	} {
		f.Add(seed, int64(1893456000))
	}
	f.Add("x", int64(0))
	f.Add("\"\\\u2028", int64(-1))
	f.Add("", int64(maxExpiry+1))
	f.Fuzz(func(t *testing.T, s string, exp int64) {
		for _, token := range []string{s, "e30." + b64(s) + ".c2ln"} {
			if got, ok := tokenExpiry(token); ok && (got.Unix() < 0 || got.Unix() > maxExpiry) {
				t.Fatalf("tokenExpiry(%q) = %d, out of range", token, got.Unix())
			}
		}
		if checkTokenShape(s) == nil && (strings.Count(s, ".") != 2 || len(s) > maxTokenSize) {
			t.Fatalf("checkTokenShape accepted %q", s)
		}
		got, ok := tokenExpiry(makeJWT(t, map[string]any{"exp": exp, "other": s}))
		if wantOK := exp > 0 && exp <= maxExpiry; ok != wantOK || (ok && got.Unix() != exp) {
			t.Fatalf("round trip of exp %d: got %d, %v", exp, got.Unix(), ok)
		}
	})
}
