package keystore

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"go.step.sm/crypto/kms"
	"go.step.sm/crypto/kms/apiv1"
	"go.step.sm/crypto/kms/uri"
)

// ErrKeyURI is wrapped by every error of OpenKey.
var ErrKeyURI = errors.New("CA key URI")

// secretKeys are the URI attributes of go.step.sm/crypto's KMSs whose
// values are secrets (a PKCS#11 or YubiKey PIN, an Azure client secret, a
// YubiKey management key); any attribute whose name holds "secret",
// "password" or "passphrase" counts too. A key URI never appears in a log
// or an error with their values.
var secretKeys = []string{"pin-value", "pin", "client-secret", "management-key"}

// secretNameParts make any attribute that holds them secret.
var secretNameParts = []string{"secret", "password", "passphrase"}

// Key is a CA signing key held by a KMS or an HSM.
type Key struct {
	crypto.Signer
	km kms.KeyManager
	// URI is the key's URI without secrets, for logs.
	URI string
}

// Close releases the KMS session (for PKCS#11, the module's sessions).
func (k *Key) Close() error { return k.km.Close() }

// Algorithm names the key's algorithm for logs, e.g. ecdsa-P-256.
func (k *Key) Algorithm() string {
	switch pub := k.Public().(type) {
	case *ecdsa.PublicKey:
		return "ecdsa-" + pub.Curve.Params().Name
	case *rsa.PublicKey:
		return fmt.Sprintf("rsa-%d", pub.N.BitLen())
	case ed25519.PublicKey:
		return "ed25519"
	default:
		return fmt.Sprintf("%T", pub)
	}
}

// CheckKeyURI refuses a key URI that is not a URI of a KMS type
// go.step.sm/crypto knows, before anything is opened.
func CheckKeyURI(rawURI string) error {
	if _, err := RedactKeyURI(rawURI); err != nil {
		return err
	}
	if _, err := apiv1.TypeOf(rawURI); err != nil {
		scheme, _, _ := strings.Cut(rawURI, ":")
		return fmt.Errorf("unknown KMS %q (want pkcs11, awskms, cloudkms, azurekms or softkms)", scheme)
	}
	return nil
}

// SignsRemotely reports whether the key of rawURI signs in a KMS or an
// HSM, so that a signature waits on it rather than on the CPU: any KMS
// type but softkms, which reads a key file.
func SignsRemotely(rawURI string) bool {
	t, err := apiv1.TypeOf(rawURI)
	return err == nil && t != apiv1.SoftKMS
}

// OpenKey opens the key a go.step.sm/crypto KMS URI names, as step's KMS
// tools take it: the same URI configures the KMS and names the key, e.g.
//
//	pkcs11:module-path=/usr/lib/softhsm/libsofthsm2.so;token=ca;id=01?pin-source=/run/pin
//	awskms:key-id=0a1b2c...;region=eu-west-1
//	cloudkms:projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1
//	azurekms:name=ca-key;vault=my-vault
//	softkms:path=/etc/workload-ca/ca-key.pem
//
// Which KMS types are available is decided by the importing program, which
// registers them with blank imports of go.step.sm/crypto/kms/<type>
// (package kmstypes has those the CA ships); softkms is always there. A
// PIN prompt is refused: the CA runs without a terminal; give the PIN in
// a file (pin-source). Errors never contain the URI's secrets.
func OpenKey(ctx context.Context, rawURI string) (*Key, error) {
	safe, err := RedactKeyURI(rawURI)
	if err != nil {
		return nil, err
	}
	u, _ := uri.Parse(rawURI) // RedactKeyURI parsed it
	if u.Has("pin-prompt") {
		return nil, fmt.Errorf("%w %s: pin-prompt needs a terminal; give the PIN in a file with pin-source", ErrKeyURI, safe)
	}
	scrub := scrubber(rawURI, safe, u)
	km, err := kms.New(ctx, apiv1.Options{URI: rawURI})
	if err != nil {
		return nil, fmt.Errorf("%w %s: %s", ErrKeyURI, safe, scrub(err))
	}
	signer, err := km.CreateSigner(&apiv1.CreateSignerRequest{SigningKey: rawURI})
	if err != nil {
		_ = km.Close()
		return nil, fmt.Errorf("%w %s: %s", ErrKeyURI, safe, scrub(err))
	}
	return &Key{Signer: signer, km: km, URI: safe}, nil
}

// RedactKeyURI returns rawURI with the values of secret attributes
// (pin-value) replaced, or an error if it is not a URI with a scheme.
func RedactKeyURI(rawURI string) (string, error) {
	u, err := uri.Parse(rawURI)
	if err != nil || u.Scheme == "" {
		return "", fmt.Errorf("%w: not a KMS URI (scheme:attributes, e.g. pkcs11:token=ca;id=01)", ErrKeyURI)
	}
	opaque, query, _ := strings.Cut(rawURI[len(u.Scheme)+1:], "?")
	out := u.Scheme + ":" + redactAttrs(opaque)
	if query != "" {
		out += "?" + redactAttrs(query)
	}
	return out, nil
}

// redactAttrs replaces the secret values in a list of attributes
// separated by ';' or '&'.
func redactAttrs(s string) string {
	var b strings.Builder
	for s != "" {
		attr, sep := s, ""
		if i := strings.IndexAny(s, ";&"); i >= 0 {
			attr, sep, s = s[:i], s[i:i+1], s[i+1:]
		} else {
			s = ""
		}
		if name, _, ok := strings.Cut(attr, "="); ok && isSecret(name) {
			attr = name + "=REDACTED"
		}
		b.WriteString(attr)
		b.WriteString(sep)
	}
	return b.String()
}

// isSecret reports whether an attribute name, escaped or not, is one of
// secretKeys or holds one of secretNameParts.
func isSecret(name string) bool {
	if n, err := url.QueryUnescape(name); err == nil {
		name = n
	}
	name = strings.ToLower(name)
	return slices.Contains(secretKeys, name) ||
		slices.ContainsFunc(secretNameParts, func(p string) bool { return strings.Contains(name, p) })
}

// scrubber returns a function that renders a KMS error without the raw URI
// or any secret value in it (the KMS libraries quote the URI they were
// given).
func scrubber(rawURI, safe string, u *uri.URI) func(error) string {
	var secrets []string
	for k, vs := range uri.Values(u) {
		if !isSecret(k) {
			continue
		}
		for _, v := range vs {
			if v != "" {
				secrets = append(secrets, v, url.QueryEscape(v))
			}
		}
	}
	return func(err error) string {
		msg := strings.ReplaceAll(err.Error(), rawURI, safe)
		for _, s := range secrets {
			msg = strings.ReplaceAll(msg, s, "REDACTED")
		}
		return msg
	}
}
