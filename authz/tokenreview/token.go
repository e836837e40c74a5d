package tokenreview

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/workload-ca/workload-ca/authz"
)

// maxTokenSize bounds the bearer tokens we check (authz.MaxTokenSize).
const maxTokenSize = authz.MaxTokenSize

// maxExpiry is the largest exp we accept: 9999-12-31T23:59:59Z.
const maxExpiry = 253402300799

// checkTokenShape rejects what cannot be a compact JWS without decoding it,
// so garbage never costs an API call: three non-empty segments separated by
// dots, each in canonical unpadded base64url (RFC 7515, section 2). Decoders
// (go-jose's, the API server's) accept padding and ignore the unused low
// bits of a segment's last character, so one signed token has hundreds of
// spellings that all verify; only the canonical one is accepted, so that a
// token is one cache entry and at most one TokenReview.
func checkTokenShape(token string) error {
	if token == "" {
		return errors.New("empty bearer token")
	}
	if len(token) > maxTokenSize {
		return fmt.Errorf("bearer token of %d bytes exceeds %d", len(token), maxTokenSize)
	}
	segments, start := 1, 0
	for i := 0; i <= len(token); i++ {
		if i < len(token) && token[i] != '.' {
			if base64URLValue(token[i]) < 0 {
				return fmt.Errorf("bearer token is not a JWT: unexpected byte at offset %d", i)
			}
			continue
		}
		if i == start {
			if i == len(token) {
				return fmt.Errorf("bearer token is not a JWT: want 3 non-empty segments, got %d", segments)
			}
			return fmt.Errorf("bearer token is not a JWT: empty segment %d", segments)
		}
		if err := checkCanonicalEnd(token[start:i]); err != nil {
			return fmt.Errorf("bearer token is not a JWT: segment %d %w", segments, err)
		}
		if i < len(token) {
			segments, start = segments+1, i+1
		}
	}
	if segments != 3 {
		return fmt.Errorf("bearer token is not a JWT: want 3 non-empty segments, got %d", segments)
	}
	return nil
}

// checkCanonicalEnd checks the length of an unpadded base64url segment and
// that the bits its last character does not use are zero.
func checkCanonicalEnd(seg string) error {
	var unused int
	switch len(seg) % 4 {
	case 1:
		return errors.New("has a length no encoding has")
	case 2:
		unused = 0x0f // one byte: 2 of the last character's 6 bits used
	case 3:
		unused = 0x03 // two bytes: 4 used
	}
	if base64URLValue(seg[len(seg)-1])&unused != 0 {
		return errors.New("is not in canonical base64url (unused bits set)")
	}
	return nil
}

// base64URLValue is the 6-bit value of a base64url character, or -1.
func base64URLValue(c byte) int {
	switch {
	case 'A' <= c && c <= 'Z':
		return int(c - 'A')
	case 'a' <= c && c <= 'z':
		return int(c-'a') + 26
	case '0' <= c && c <= '9':
		return int(c-'0') + 52
	case c == '-':
		return 62
	case c == '_':
		return 63
	}
	return -1
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
