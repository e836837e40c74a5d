package tokenreview

import (
	"bytes"
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/workload-ca/workload-ca/authz"
)

func TestCheckTokenShape(t *testing.T) {
	valid := makeJWT(t, map[string]any{"exp": 1})
	tests := []struct {
		name    string
		token   string
		wantErr string
	}{
		{"jwt", valid, ""},
		{"one-byte and two-byte final groups", "eyJh.eyJiYQ.c2lnbg", ""},
		{"empty", "", "empty bearer token"},
		{"one segment", "abcd", "want 3 non-empty segments, got 1"},
		{"two segments", "abcd.defg", "got 2"},
		{"four segments", "abcd.bbbb.cccc.dddd", "got 4"},
		{"empty header", ".bbbb.cccc", "empty segment 1"},
		{"empty payload", "aaaa..cccc", "empty segment 2"},
		{"empty signature", "aaaa.bbbb.", "want 3 non-empty segments"},
		{"space", "aaaa.b c.dddd", "unexpected byte at offset 6"},
		{"standard base64", "a+/a.bbbb.cccc", "unexpected byte at offset 1"},
		{"padded segments", "eyJh.eyJiYQ==.c2lnbg", "unexpected byte at offset 11"},
		{"padding inside segment", "a=bb.cccc.dddd", "unexpected byte at offset 1"},
		{"padding only", "=.bbbb.cccc", "unexpected byte at offset 0"},
		{"bearer prefix", "Bearer " + valid, "unexpected byte at offset 6"},
		{"trailing newline", valid + "\n", "unexpected byte"},
		{"segment of impossible length", "aaaaa.bbbb.cccc", "segment 1 has a length no encoding has"},
		{"unused bits of a one-byte group", "eyJh.eyJiYR.c2lnbg", "segment 2 is not in canonical base64url"},
		{"unused bits of a two-byte group", "eyJh.eyJiYQ.c2lnbh", "segment 3 is not in canonical base64url"},
		{"too large", strings.Repeat("a", maxTokenSize-9) + ".bbbb.cccc", "exceeds 8192"},
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

// spellings returns other spellings of token that lenient base64url
// decoders read as the same bytes: each segment padded, and each segment's
// last character with its unused bits set.
func spellings(t *testing.T, token string) []string {
	t.Helper()
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	segs := strings.Split(token, ".")
	var out []string
	for i, seg := range segs {
		with := func(s string) string {
			c := slices.Clone(segs)
			c[i] = s
			return strings.Join(c, ".")
		}
		unused := map[int]int{2: 0x0f, 3: 0x03}[len(seg)%4]
		if unused == 0 {
			continue
		}
		out = append(out, with(seg+strings.Repeat("=", 4-len(seg)%4)))
		v := strings.IndexByte(alphabet, seg[len(seg)-1])
		for x := 1; x <= unused; x++ {
			variant := seg[:len(seg)-1] + string(alphabet[v|x])
			want, _ := base64.RawURLEncoding.DecodeString(seg)
			if got, err := base64.RawURLEncoding.DecodeString(variant); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("variant %q of segment %d does not decode alike: %v", variant, i, err)
			}
			out = append(out, with(variant))
		}
	}
	return out
}

// One signed token has one spelling: the variants that lenient decoders
// read alike are refused before any verification, TokenReview or cache
// slot, in both verification modes, and do not keep the real token out.
func TestTokenSpellingsAreRefusedUnreviewed(t *testing.T) {
	for _, mode := range []string{"local", "tokenreview"} {
		t.Run(mode, func(t *testing.T) {
			f := newLocalFixture(t)
			r := f.r
			if mode == "tokenreview" {
				r = newReviewer(t, Config{Client: f.api.AuthenticationV1(), Clock: f.clock})
			}
			token := f.is.signClaims(t, "k1", podClaims(f.clock.Now()))
			variants := spellings(t, token)
			if len(variants) < 10 {
				t.Fatalf("only %d spellings of the token", len(variants))
			}
			for _, v := range variants {
				if _, err := r.Authenticate(t.Context(), v); !errors.Is(err, authz.ErrUnauthenticated) {
					t.Fatalf("spelling %q: error = %v, want unauthenticated", v[len(v)-8:], err)
				}
			}
			if n := f.api.calls.Load(); n != 0 {
				t.Fatalf("%d spellings cost %d TokenReviews, want 0", len(variants), n)
			}
			if n := len(r.cache.Keys()); n != 0 {
				t.Fatalf("%d spellings took %d cache entries, want 0", len(variants), n)
			}
			if _, err := r.Authenticate(t.Context(), token); err != nil {
				t.Fatalf("the token itself: %v", err)
			}
		})
	}
}

// FuzzCheckTokenShape holds the shape check to the standard library's
// strict base64url decoder: a token is accepted exactly when it has three
// non-empty segments, each of which strict, unpadded decoding accepts
// (newlines aside, which that decoder skips).
func FuzzCheckTokenShape(f *testing.F) {
	for _, seed := range []string{"", "a.b.c", "eyJh.eyJiYQ.c2lnbg", "eyJh.eyJiYR.c2lnbg", "eyJh.eyJiYQ==.c2lnbg",
		"aaaaa.bbbb.cccc", "a\nb.cccc.dddd", makeJWT(f, map[string]any{"exp": 1})} {
		f.Add(seed)
	}
	strict := base64.RawURLEncoding.Strict()
	f.Fuzz(func(t *testing.T, s string) {
		segs := strings.Split(s, ".")
		want := len(segs) == 3 && len(s) <= maxTokenSize && !strings.ContainsAny(s, "\r\n")
		for _, seg := range segs {
			if _, err := strict.DecodeString(seg); err != nil || seg == "" {
				want = false
			}
		}
		if err := checkTokenShape(s); (err == nil) != want {
			t.Fatalf("checkTokenShape(%q) = %v, want accepted %v", s, err, want)
		}
	})
}
