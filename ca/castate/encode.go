package castate

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"time"

	"go.step.sm/crypto/pemutil"
)

// Keys of the Secret's data.
const (
	// KeyState holds the versioned JSON state: the only key Decode reads.
	KeyState = "ca-state.json"
	// KeyRootCert and KeyCACert both hold the root bundle (every
	// authority's certificate, PEM), for consumers of the Istio and the
	// cert-manager layout. They are written, never read, and not for
	// intermediates of a plug-in root (KindIntermediates): their bundle is
	// not in the state. For upstream intermediates they hold the anchors.
	KeyRootCert = "root-cert.pem"
	KeyCACert   = "ca.crt"
)

// formatVersion is the version of the JSON format Encode writes and the
// only one Decode accepts.
const formatVersion = 1

// stateJSON is the serialized form of a State. Times are RFC 3339 in UTC
// (with fractional seconds, so that a round trip is exact), empty when zero.
// Kind is omitted for self-signed roots, so that their encoding is the
// one of replicas that know no kinds, and such replicas refuse (as an
// unknown field) a state of intermediates.
type stateJSON struct {
	Version     int             `json:"version"`
	Kind        Kind            `json:"kind,omitempty"`
	Authorities []authorityJSON `json:"authorities"`
}

type authorityJSON struct {
	Status        Status `json:"status"`
	Certificate   string `json:"certificate"`
	PrivateKey    string `json:"privateKey,omitempty"`
	PreparedAt    string `json:"preparedAt,omitempty"`
	ActivatedAt   string `json:"activatedAt,omitempty"`
	RetiringSince string `json:"retiringSince,omitempty"`
	// Chain is Authority.Chain, PEM, for upstream intermediates only.
	Chain []string `json:"chain,omitempty"`
}

// Encode validates s and returns the Secret data that holds it: KeyState,
// and for self-signed roots the root bundle under KeyRootCert and
// KeyCACert. The output is a function of s: encoding an unchanged state
// gives the same bytes.
func Encode(s State) (map[string][]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return encode(s)
}

// encode is Encode for a state the caller has validated.
func encode(s State) (map[string][]byte, error) {
	out := stateJSON{Version: formatVersion, Kind: s.Kind, Authorities: make([]authorityJSON, len(s.Authorities))}
	for i, a := range s.Authorities {
		var keyPEM string
		if a.Status != StatusRetiring { // a retiring authority's key is never written
			key, err := pemutil.Serialize(a.Key, pemutil.WithPKCS8(true))
			if err != nil {
				return nil, fmt.Errorf("%w: authority %d: encoding the key: %w", ErrInvalidState, i, err)
			}
			keyPEM = string(pem.EncodeToMemory(key))
		}
		cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Cert.Raw})
		out.Authorities[i] = authorityJSON{
			Status:        a.Status,
			Certificate:   string(cert),
			PrivateKey:    keyPEM,
			PreparedAt:    formatTime(a.PreparedAt),
			ActivatedAt:   formatTime(a.ActivatedAt),
			RetiringSince: formatTime(a.RetiringSince),
			Chain:         encodeChain(a.Chain),
		}
	}
	state, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, err
	}
	if s.Kind == KindIntermediates {
		return map[string][]byte{KeyState: state}, nil
	}
	var bundle bytes.Buffer
	for _, c := range s.bundle() {
		bundle.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
	}
	return map[string][]byte{
		KeyState:    state,
		KeyRootCert: bundle.Bytes(),
		KeyCACert:   bytes.Clone(bundle.Bytes()),
	}, nil
}

// Decode parses and validates the state under KeyState. It is strict:
// unknown fields, trailing data, another format version, PEM with headers
// or extra blocks, and encrypted keys are refused. Every error wraps
// ErrInvalidState.
func Decode(data map[string][]byte) (State, error) {
	raw, ok := data[KeyState]
	if !ok {
		return State{}, invalid("no %s key", KeyState)
	}
	var in stateJSON
	if err := decodeStrict(raw, &in); err != nil {
		return State{}, invalid("%s: %v", KeyState, err)
	}
	if in.Version != formatVersion {
		return State{}, invalid("%s: format version %d, want %d", KeyState, in.Version, formatVersion)
	}
	if n := len(in.Authorities); n == 0 || n > MaxAuthorities {
		return State{}, invalid("%d authorities, want 1 to %d", n, MaxAuthorities)
	}
	s := State{Kind: in.Kind, Authorities: make([]Authority, len(in.Authorities))}
	for i, a := range in.Authorities {
		var err error
		if s.Authorities[i], err = a.decode(); err != nil {
			return State{}, invalid("authority %d: %v", i, err)
		}
	}
	if err := s.Validate(); err != nil {
		return State{}, err
	}
	return s, nil
}

func decodeStrict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

func (a authorityJSON) decode() (Authority, error) {
	out := Authority{Status: a.Status}
	var err error
	if out.Cert, err = parseCert(a.Certificate); err != nil {
		return out, err
	}
	// A retiring authority has no key; one written before keys were
	// dropped is not read, and goes with the next write.
	if a.Status != StatusRetiring {
		if out.Key, err = parseKey(a.PrivateKey); err != nil {
			return out, err
		}
	}
	for i, c := range a.Chain {
		x, err := parseCert(c)
		if err != nil {
			return out, fmt.Errorf("chain %d: %w", i, err)
		}
		out.Chain = append(out.Chain, x)
	}
	times := []struct {
		name string
		in   string
		out  *time.Time
	}{
		{"preparedAt", a.PreparedAt, &out.PreparedAt},
		{"activatedAt", a.ActivatedAt, &out.ActivatedAt},
		{"retiringSince", a.RetiringSince, &out.RetiringSince},
	}
	for _, t := range times {
		if *t.out, err = parseTime(t.in); err != nil {
			return out, fmt.Errorf("%s: %w", t.name, err)
		}
	}
	return out, nil
}

// bundle is the trust bundle a state of self-signed roots or upstream
// intermediates holds: every authority's certificate, or the anchors.
func (s State) bundle() []*x509.Certificate {
	if s.Kind == KindUpstream {
		return s.Anchors()
	}
	out := make([]*x509.Certificate, len(s.Authorities))
	for i, a := range s.Authorities {
		out[i] = a.Cert
	}
	return out
}

func encodeChain(chain []*x509.Certificate) []string {
	var out []string
	for _, c := range chain {
		out = append(out, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})))
	}
	return out
}

func parseCert(s string) (*x509.Certificate, error) {
	der, err := singleBlock(s, "CERTIFICATE")
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	return c, nil
}

// parseKey accepts one unencrypted PKCS#8 "PRIVATE KEY" block; checking
// the type first keeps pemutil from asking for a password.
func parseKey(s string) (crypto.Signer, error) {
	if _, err := singleBlock(s, "PRIVATE KEY"); err != nil {
		return nil, fmt.Errorf("private key: %w", err)
	}
	k, err := pemutil.ParseKey([]byte(s))
	if err != nil {
		return nil, fmt.Errorf("private key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key: %T cannot sign", k)
	}
	return signer, nil
}

// singleBlock returns the bytes of the one PEM block in s, of type typ and
// without headers.
func singleBlock(s, typ string) ([]byte, error) {
	b, rest := pem.Decode([]byte(s))
	switch {
	case b == nil:
		return nil, errors.New("no PEM block")
	case b.Type != typ:
		return nil, fmt.Errorf("PEM block %q, want %q", b.Type, typ)
	case len(b.Headers) != 0:
		return nil, errors.New("PEM headers are not allowed")
	case len(bytes.TrimSpace(rest)) != 0:
		return nil, errors.New("more than one PEM block")
	}
	return b.Bytes, nil
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, err
	}
	return t.UTC(), nil
}
