// Package contest notices when another controller keeps overwriting an
// object a publisher owns, names it, and paces the publisher's repairs.
//
// Two controllers that each restore their own content on every change
// event (istiod's namespace controller and the CA's root ConfigMap
// publisher, say) rewrite the object back and forth as fast as the API
// server allows. A Tracker remembers what the publisher last wrote to (or
// found right in) each key: content other than that was written by
// someone else since, whatever the labels now say. The publisher still
// repairs it, at most once per interval per key, and says who the other
// writer is (from the object's managed fields) so that an operator can
// turn one of the two off.
//
// The publisher also stamps what it writes (Annotation: the content's
// hash), so that a replica without history, a new leader after a
// failover, tells another writer's edit from its predecessor's write.
package contest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
)

// DefaultInterval is the least time between two repairs of one key after
// another writer changed it.
const DefaultInterval = time.Minute

// Annotation is the stamp a publisher puts on what it writes: the
// SHA-256 of the content, hex. Content that does not match its stamp was
// written by someone else since (one who kept the annotations, as every
// read-modify-write client does).
const Annotation = "workload-ca.io/published-sha256"

// Stamp returns a copy of annotations with content's stamp.
func Stamp(annotations map[string]string, content string) map[string]string {
	out := maps.Clone(annotations)
	if out == nil {
		out = make(map[string]string, 1)
	}
	out[Annotation] = digest(content)
	return out
}

// Stamped reports whether annotations carry content's stamp.
func Stamped(annotations map[string]string, content string) bool {
	return annotations[Annotation] == digest(content)
}

func digest(content string) string {
	sum := sha256.Sum256([]byte(content))
	return hex.EncodeToString(sum[:])
}

// Tracker remembers, per key, the content last written and when a
// contested edit was last repaired. It is safe for concurrent use. A
// Tracker lives as long as one run of a publisher; a new leader's starts
// empty, and Edited then relies on the stamp the last writer left.
type Tracker struct {
	clock    clock.PassiveClock
	interval time.Duration

	mu       sync.Mutex
	written  map[string]string
	repaired map[string]time.Time
}

// NewTracker returns a Tracker that allows one repair of a key per
// interval (DefaultInterval if not positive).
func NewTracker(clk clock.PassiveClock, interval time.Duration) *Tracker {
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Tracker{clock: clk, interval: interval, written: map[string]string{}, repaired: map[string]time.Time{}}
}

// Wrote records that content was written to key.
func (t *Tracker) Wrote(key, content string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.written[key] = content
}

// Forget drops key, e.g. when its object or namespace is gone.
func (t *Tracker) Forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.written, key)
	delete(t.repaired, key)
}

// Edited reports whether key, found holding current with annotations,
// was changed by someone else since the publisher last wrote it: current
// is not what the stamp says was written, or, without a stamp (another
// writer dropped it), not what this Tracker last wrote. With neither it
// reports false: nothing tells.
func (t *Tracker) Edited(key, current string, annotations map[string]string) bool {
	if _, ok := annotations[Annotation]; ok {
		return !Stamped(annotations, current)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	w, ok := t.written[key]
	return ok && w != current
}

// Repair reports how long to wait before repairing a contested edit of
// key; zero means now, and records the repair as made now.
func (t *Tracker) Repair(key string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.Now()
	if last, ok := t.repaired[key]; ok {
		if wait := last.Add(t.interval).Sub(now); wait > 0 {
			return wait
		}
	}
	t.repaired[key] = now
	return 0
}

// Writers returns the field managers other than self that own the field
// at path (e.g. "data", "root-cert.pem") in obj's managed fields, sorted
// and without duplicates.
func Writers(obj metav1.Object, self string, path ...string) []string {
	var out []string
	for _, e := range obj.GetManagedFields() {
		if e.Manager == self || e.FieldsV1 == nil || slices.Contains(out, e.Manager) {
			continue
		}
		if owns(e.FieldsV1.GetRawBytes(), path) {
			out = append(out, e.Manager)
		}
	}
	slices.Sort(out)
	return out
}

// owns reports whether a FieldsV1 set ({"f:data":{"f:key":{}}}) holds
// path. Malformed sets hold nothing.
func owns(raw []byte, path []string) bool {
	for _, p := range path {
		var set map[string]json.RawMessage
		if err := json.Unmarshal(raw, &set); err != nil {
			return false
		}
		next, ok := set["f:"+p]
		if !ok {
			return false
		}
		raw = next
	}
	return true
}
