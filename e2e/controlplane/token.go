package controlplane

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// ResignToken decodes a service-account JWT issued by this control plane,
// lets edit change its claims, and signs the result with the apiserver's
// own service-account key (same header, so same kid). The apiserver then
// trusts the signature and judges only the claims: use it for tokens the
// TokenRequest API will not mint, such as expired ones. Numeric claims
// arrive as json.Number.
func (c *ControlPlane) ResignToken(token string, edit func(claims map[string]any) error) (string, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", fmt.Errorf("resign: not a compact JWS")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", fmt.Errorf("resign: payload: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var claims map[string]any
	if err := dec.Decode(&claims); err != nil {
		return "", fmt.Errorf("resign: claims: %w", err)
	}
	if err := edit(claims); err != nil {
		return "", err
	}
	if payload, err = json.Marshal(claims); err != nil {
		return "", err
	}
	signingInput := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload)
	sig, err := signES256(c.pki.saKey, signingInput)
	if err != nil {
		return "", err
	}
	return signingInput + "." + sig, nil
}

// ExpireToken returns a copy of token whose iat, nbf and exp are shifted
// back so that it expired ago before now. The apiserver allows 60s of clock
// skew, so ago should exceed a minute for the token to be rejected.
func (c *ControlPlane) ExpireToken(token string, ago time.Duration) (string, error) {
	return c.ResignToken(token, func(claims map[string]any) error {
		exp, err := numericClaim(claims, "exp")
		if err != nil {
			return err
		}
		shift := exp - time.Now().Add(-ago).Unix()
		for _, name := range []string{"iat", "nbf", "exp"} {
			v, err := numericClaim(claims, name)
			if err != nil {
				continue // optional claim
			}
			claims[name] = v - shift
		}
		return nil
	})
}

func numericClaim(claims map[string]any, name string) (int64, error) {
	n, ok := claims[name].(json.Number)
	if !ok {
		return 0, fmt.Errorf("claim %q missing or not a number", name)
	}
	return n.Int64()
}

// signES256 returns the base64url JWS signature (r||s) over input.
func signES256(key *ecdsa.PrivateKey, input string) (string, error) {
	digest := sha256.Sum256([]byte(input))
	r, s, err := ecdsa.Sign(rand.Reader, key, digest[:])
	if err != nil {
		return "", err
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return base64.RawURLEncoding.EncodeToString(sig), nil
}
