package tokenreview

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// maxTokenSize bounds the bearer tokens we send for review. Projected service
// account tokens are about 1 KiB.
const maxTokenSize = 8 << 10

// maxExpiry is the largest exp we accept: 9999-12-31T23:59:59Z.
const maxExpiry = 253402300799

// checkTokenShape rejects what cannot be a compact JWS (three non-empty
// base64url segments separated by dots) without decoding it, so garbage
// never costs an API call.
func checkTokenShape(token string) error {
	if token == "" {
		return errors.New("empty bearer token")
	}
	if len(token) > maxTokenSize {
		return fmt.Errorf("bearer token of %d bytes exceeds %d", len(token), maxTokenSize)
	}
	segments, start, padded := 1, 0, false
	for i := 0; i < len(token); i++ {
		switch c := token[i]; {
		case c == '.':
			if i == start {
				return fmt.Errorf("bearer token is not a JWT: empty segment %d", segments)
			}
			segments, start, padded = segments+1, i+1, false
		case c == '=' && i > start:
			padded = true
		case padded || !isBase64URL(c):
			return fmt.Errorf("bearer token is not a JWT: unexpected byte at offset %d", i)
		}
	}
	if segments != 3 || start == len(token) {
		return fmt.Errorf("bearer token is not a JWT: want 3 non-empty segments, got %d", segments)
	}
	return nil
}

func isBase64URL(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}

// tokenExpiry returns the exp claim of a compact JWT, read from its payload
// WITHOUT verifying the signature: the TokenReview did the verification, and
// exp only bounds how long a positive review may be cached. ok is false when
// the payload or its exp is missing or malformed, or exp is outside
// (0, 9999-12-31]. A fractional exp is truncated (earlier, never later).
// Keys match case-sensitively, as in the JOSE library the apiserver uses.
func tokenExpiry(token string) (exp time.Time, ok bool) {
	_, rest, found := strings.Cut(token, ".")
	payload, _, found2 := strings.Cut(rest, ".")
	if !found || !found2 {
		return time.Time{}, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(payload, "="))
	if err != nil {
		return time.Time{}, false
	}
	var claims map[string]json.RawMessage
	if err := json.Unmarshal(raw, &claims); err != nil {
		return time.Time{}, false
	}
	// Only a JSON number parses: strings ("\"1\""), null and objects fail,
	// and so does an overflow (1e999).
	f, err := strconv.ParseFloat(string(claims["exp"]), 64)
	if err != nil || f <= 0 || f > maxExpiry {
		return time.Time{}, false
	}
	return time.Unix(int64(f), 0), true
}
