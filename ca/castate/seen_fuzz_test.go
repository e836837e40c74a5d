package castate

import (
	"maps"
	"testing"
	"time"
)

// A record that decodes encodes back to the same record.
func FuzzDecodeRootsSeen(f *testing.F) {
	f.Add([]byte(`{"version":1,"roots":[{"sha256":"` + "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff" + `","firstSeen":"2030-01-01T00:00:00.5Z"}]}`))
	f.Add([]byte(`{"version":1,"roots":[]}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`{"version":1,"roots":[{"sha256":"zz","firstSeen":""}]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		seen, err := decodeRootsSeen(raw)
		if err != nil {
			return
		}
		again, err := decodeRootsSeen(encodeRootsSeen(seen))
		if err != nil || !maps.EqualFunc(seen, again, time.Time.Equal) {
			t.Fatalf("%q: round trip gave %v, %v; want %v", raw, again, err, seen)
		}
	})
}
