package castate

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// KeyRootsSeen holds when the leader first saw each root of the plug-in
// bundle (see SecretStore.RootsSeen). It sits beside KeyState, not in it:
// replicas that know no such record keep reading the state.
const KeyRootsSeen = "roots-seen.json"

// RootDigest identifies a root: the SHA-256 of its DER.
type RootDigest [sha256.Size]byte

// DigestOf returns c's RootDigest.
func DigestOf(c *x509.Certificate) RootDigest { return sha256.Sum256(c.Raw) }

// rootsSeenJSON is the serialized form of the record: digests in hex,
// times RFC 3339 in UTC.
type rootsSeenJSON struct {
	Version int            `json:"version"`
	Roots   []rootSeenJSON `json:"roots"`
}

type rootSeenJSON struct {
	SHA256    string `json:"sha256"`
	FirstSeen string `json:"firstSeen"`
}

// RootsSeen records, in the Secret, when the roots of the plug-in bundle
// were first seen by a leader, and returns the record: roots already in
// it keep their time, new ones get now, and roots no longer in the bundle
// are dropped (one that comes back counts again). A new leader thus times
// the move to a new signing root from when its predecessor published the
// root, not from its own start. A record that does not parse is replaced,
// with a warning: it only ever makes a move later.
func (s *SecretStore) RootsSeen(ctx context.Context, roots []*x509.Certificate, now time.Time) (map[RootDigest]time.Time, error) {
	var out map[RootDigest]time.Time
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sec, err := s.get(ctx)
		if err != nil {
			return err
		}
		old, err := decodeRootsSeen(sec.Data[KeyRootsSeen])
		if err != nil {
			s.log.WarnContext(ctx, "root sightings unreadable; recording them anew", "error", err.Error())
			old = nil
		}
		out = make(map[RootDigest]time.Time, len(roots))
		for _, r := range roots {
			d := DigestOf(r)
			if t, ok := old[d]; ok {
				out[d] = t
			} else {
				out[d] = now.UTC()
			}
		}
		if err == nil && maps.EqualFunc(old, out, time.Time.Equal) {
			return nil
		}
		upd := sec.DeepCopy()
		if upd.Data == nil {
			upd.Data = map[string][]byte{}
		}
		upd.Data[KeyRootsSeen] = encodeRootsSeen(out)
		if _, err := s.client.CoreV1().Secrets(s.ns).Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update Secret %s/%s: %w", s.ns, s.name, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// encodeRootsSeen writes the record sorted by digest, so an unchanged
// record gives the same bytes.
func encodeRootsSeen(seen map[RootDigest]time.Time) []byte {
	in := rootsSeenJSON{Version: 1, Roots: make([]rootSeenJSON, 0, len(seen))}
	for _, d := range slices.SortedFunc(maps.Keys(seen), func(a, b RootDigest) int { return slices.Compare(a[:], b[:]) }) {
		in.Roots = append(in.Roots, rootSeenJSON{SHA256: hex.EncodeToString(d[:]), FirstSeen: formatTime(seen[d])})
	}
	b, _ := json.MarshalIndent(in, "", "  ") // strings and ints only: cannot fail
	return b
}

// decodeRootsSeen parses a record; none (nil) is an empty one.
func decodeRootsSeen(raw []byte) (map[RootDigest]time.Time, error) {
	out := map[RootDigest]time.Time{}
	if raw == nil {
		return out, nil
	}
	var in rootsSeenJSON
	if err := decodeStrict(raw, &in); err != nil {
		return nil, fmt.Errorf("%s: %w", KeyRootsSeen, err)
	}
	if in.Version != 1 {
		return nil, fmt.Errorf("%s: format version %d, want 1", KeyRootsSeen, in.Version)
	}
	for _, r := range in.Roots {
		var d RootDigest
		b, err := hex.DecodeString(r.SHA256)
		if err != nil || len(b) != len(d) {
			return nil, fmt.Errorf("%s: digest %q is not hex SHA-256", KeyRootsSeen, r.SHA256)
		}
		copy(d[:], b)
		t, err := parseTime(r.FirstSeen)
		if err == nil && t.IsZero() {
			err = errors.New("empty")
		}
		if err != nil {
			return nil, fmt.Errorf("%s: first sighting %q: %w", KeyRootsSeen, r.FirstSeen, err)
		}
		out[d] = t
	}
	return out, nil
}
