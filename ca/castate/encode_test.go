package castate_test

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"go.step.sm/crypto/keyutil"
	"go.step.sm/crypto/pemutil"

	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestEncodeRoundTrip(t *testing.T) {
	s := stateOf(t, retiring, active, prepared)
	ed := testca.NewRoot(t, testca.Ed25519)
	rsa := testca.NewRoot(t, testca.RSA2048)
	s.Authorities = append([]castate.Authority{
		{Cert: ed.Cert, Key: ed.Key, Status: retiring, PreparedAt: t0, RetiringSince: t0.Add(time.Nanosecond)},
		{Cert: rsa.Cert, Key: rsa.Key, Status: retiring, PreparedAt: t0, RetiringSince: t0.In(time.FixedZone("x", 3600))},
	}, s.Authorities...)
	data := mustEncode(t, s)
	got, err := castate.Decode(data)
	if err != nil {
		t.Fatalf("Decode(Encode(s)): %v", err)
	}
	if len(got.Authorities) != len(s.Authorities) {
		t.Fatalf("%d authorities back, want %d", len(got.Authorities), len(s.Authorities))
	}
	for i, a := range got.Authorities {
		w := s.Authorities[i]
		if w.Status == retiring {
			w.Key = nil // never written
		}
		if !a.Cert.Equal(w.Cert) || !sameKey(a.Key, w.Key) || a.Status != w.Status ||
			!a.PreparedAt.Equal(w.PreparedAt) || !a.ActivatedAt.Equal(w.ActivatedAt) || !a.RetiringSince.Equal(w.RetiringSince) {
			t.Errorf("authority %d differs after a round trip", i)
		}
	}
	if again := mustEncode(t, got); !bytes.Equal(again[castate.KeyState], data[castate.KeyState]) {
		t.Error("re-encoding the decoded state gives other bytes")
	}
	checkBundle(t, data[castate.KeyRootCert], s)
	if !bytes.Equal(data[castate.KeyCACert], data[castate.KeyRootCert]) {
		t.Errorf("%s differs from %s", castate.KeyCACert, castate.KeyRootCert)
	}
}

func sameKey(a, b any) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return keyutil.Equal(a, b)
}

// A retiring authority never signs again, so the Secret holds no key of
// one: Encode drops it, Decode of a state written with one ignores it, and
// a retiring authority without a key is a valid state.
func TestRetiringKeysNotKept(t *testing.T) {
	s := stateOf(t, retiring, active)
	if s.Authorities[0].Key == nil {
		t.Fatal("the test's retiring authority has no key to drop")
	}
	data := mustEncode(t, s)
	var doc struct {
		Authorities []map[string]any `json:"authorities"`
	}
	if err := json.Unmarshal(data[castate.KeyState], &doc); err != nil {
		t.Fatal(err)
	}
	if _, ok := doc.Authorities[0]["privateKey"]; ok {
		t.Errorf("the retiring authority's key was written:\n%s", data[castate.KeyState])
	}
	if strings.Count(string(data[castate.KeyState]), "BEGIN PRIVATE KEY") != 1 { // the active key
		t.Errorf("want exactly the active key in the Secret:\n%s", data[castate.KeyState])
	}
	got, err := castate.Decode(data)
	if err != nil {
		t.Fatalf("Decode of a retiring authority without a key: %v", err)
	}
	if got.Authorities[0].Key != nil {
		t.Error("decoded a key for the retiring authority")
	}
	if _, err := got.Material(); err != nil {
		t.Fatalf("Material of a state with a keyless retiring root: %v", err)
	}
	// An active or prepared authority still needs its key.
	noKey := stateOf(t, active)
	noKey.Authorities[0].Key = nil
	if _, err := castate.Encode(noKey); !errors.Is(err, castate.ErrInvalidState) {
		t.Errorf("Encode of an active authority without a key: %v, want ErrInvalidState", err)
	}
}

// TestFormat pins the JSON format: field names, version, PKCS#8 PEM keys
// and RFC 3339 UTC times.
func TestFormat(t *testing.T) {
	s := stateOf(t, active)
	a := s.Authorities[0]
	key, err := pemutil.Serialize(a.Key, pemutil.WithPKCS8(true))
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string]any{"version": 1, "authorities": []map[string]string{{
		"status":      "active",
		"certificate": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Cert.Raw})),
		"privateKey":  string(pem.EncodeToMemory(key)),
		"preparedAt":  "2030-01-01T00:00:00Z",
		"activatedAt": "2030-01-01T01:00:00Z",
	}}}
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := castate.Decode(map[string][]byte{castate.KeyState: raw})
	if err != nil {
		t.Fatalf("Decode of the documented format: %v", err)
	}
	if !sameState(t, got, s) {
		t.Error("decoded state differs from the one written by hand")
	}
	if enc := string(mustEncode(t, s)[castate.KeyState]); !strings.Contains(enc, `"activatedAt": "2030-01-01T01:00:00Z"`) {
		t.Errorf("Encode wrote\n%s\nwant RFC 3339 UTC times", enc)
	}
}

func TestDecodeRejects(t *testing.T) {
	valid := string(mustEncode(t, stateOf(t, active))[castate.KeyState])
	var doc map[string]any
	if err := json.Unmarshal([]byte(valid), &doc); err != nil {
		t.Fatal(err)
	}
	auth := func(field, value string) string { return replaceField(t, doc, field, value) }
	keyPEM := authorityField(doc, "privateKey")
	tests := []struct{ name, state string }{
		{"garbage", "not json"},
		{"empty object", "{}"},
		{"trailing data", valid + "{}"},
		{"unknown field", strings.Replace(valid, `"version"`, `"extra": 1, "version"`, 1)},
		{"version 2", strings.Replace(valid, `"version": 1`, `"version": 2`, 1)},
		{"no authorities", `{"version": 1, "authorities": []}`},
		{"bad status", auth("status", "next")},
		{"bad time", auth("activatedAt", "yesterday")},
		{"certificate not PEM", auth("certificate", "MIIB")},
		{"certificate twice", auth("certificate", authorityField(doc, "certificate")+authorityField(doc, "certificate"))},
		{"key in certificate", auth("certificate", keyPEM)},
		{"encrypted key", auth("privateKey", strings.ReplaceAll(keyPEM, "PRIVATE KEY", "ENCRYPTED PRIVATE KEY"))},
		{"key with PEM headers", auth("privateKey", strings.Replace(keyPEM, "-----\n", "-----\nProc-Type: 4,ENCRYPTED\n\n", 1))},
		{"key of another root", auth("privateKey", string(mustEncodeKey(t)))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := castate.Decode(map[string][]byte{castate.KeyState: []byte(tt.state)})
			t.Log(err)
			if !errors.Is(err, castate.ErrInvalidState) {
				t.Fatalf("Decode = %v, want ErrInvalidState", err)
			}
		})
	}
	if _, err := castate.Decode(map[string][]byte{castate.KeyRootCert: []byte(valid)}); !errors.Is(err, castate.ErrInvalidState) {
		t.Errorf("Decode without %s = %v, want ErrInvalidState", castate.KeyState, err)
	}
}

func TestEncodeRefusesInvalidState(t *testing.T) {
	if _, err := castate.Encode(stateOf(t, prepared)); !errors.Is(err, castate.ErrInvalidState) {
		t.Fatalf("Encode of a state without an active root = %v, want ErrInvalidState", err)
	}
}

// FuzzDecode checks that Decode never panics, and that whatever it accepts
// encodes again and decodes to the same state.
func FuzzDecode(f *testing.F) {
	for _, s := range []castate.State{stateOf(f, active), stateOf(f, retiring, active, prepared)} {
		raw := mustEncode(f, s)[castate.KeyState]
		f.Add(raw)
		f.Add(raw[:len(raw)/2])
		f.Add(bytes.Replace(raw, []byte(`"active"`), []byte(`"prepared"`), 1))
	}
	f.Add([]byte(`{"version": 1, "authorities": [{"status": "active", "certificate": "", "privateKey": ""}]}`))
	f.Add([]byte("null"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		s, err := castate.Decode(map[string][]byte{castate.KeyState: raw})
		if err != nil {
			if !errors.Is(err, castate.ErrInvalidState) {
				t.Fatalf("Decode error %v does not wrap ErrInvalidState", err)
			}
			return
		}
		data, err := castate.Encode(s)
		if err != nil {
			t.Fatalf("Encode of a decoded state: %v", err)
		}
		back, err := castate.Decode(data)
		if err != nil {
			t.Fatalf("Decode(Encode(Decode(x))): %v", err)
		}
		if !sameState(t, s, back) {
			t.Fatal("round trip changed the state")
		}
	})
}

// checkBundle checks that bundle is every authority's certificate, in order.
func checkBundle(t *testing.T, bundle []byte, s castate.State) {
	t.Helper()
	for i, a := range s.Authorities {
		var b *pem.Block
		if b, bundle = pem.Decode(bundle); b == nil || !bytes.Equal(b.Bytes, a.Cert.Raw) {
			t.Fatalf("bundle certificate %d is not authority %d's", i, i)
		}
	}
	if len(bytes.TrimSpace(bundle)) != 0 {
		t.Error("bundle holds more than the authorities' certificates")
	}
}

func authorityField(doc map[string]any, field string) string {
	return doc["authorities"].([]any)[0].(map[string]any)[field].(string)
}

// replaceField returns doc as JSON with the first authority's field set.
func replaceField(t *testing.T, doc map[string]any, field, value string) string {
	t.Helper()
	a := doc["authorities"].([]any)[0].(map[string]any)
	old := a[field]
	a[field] = value
	defer func() { a[field] = old }()
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

func mustEncodeKey(t *testing.T) []byte {
	t.Helper()
	b, err := pemutil.Serialize(newRoot(t).Signer, pemutil.WithPKCS8(true))
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(b)
}
