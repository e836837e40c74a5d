package podindex

import (
	"crypto/sha256"
	"strings"
)

// interner maps names (node names, namespace/service account pairs) to small
// integer ids so that per-pod data is two uint32s instead of three strings.
//
// Ids are reference counted by the pods that use them. When the last pod of a
// name goes away the name is forgotten and its id is reused, so the tables
// are bounded by the names in use, not by every node or service account ever
// seen (nodes churn with autoscaling).
type interner[K comparable] struct {
	ids   map[K]uint32
	keys  []K
	refs  []int32
	free  []uint32
	clone func(K) K // copies a new key so the table never pins a decoded object
}

func newInterner[K comparable](clone func(K) K) interner[K] {
	return interner[K]{ids: make(map[K]uint32), clone: clone}
}

// acquire returns the id of k and takes one reference to it.
func (t *interner[K]) acquire(k K) uint32 {
	if id, ok := t.ids[k]; ok {
		t.refs[id]++
		return id
	}
	k = t.clone(k)
	var id uint32
	if n := len(t.free); n > 0 {
		id = t.free[n-1]
		t.free = t.free[:n-1]
		t.keys[id], t.refs[id] = k, 1
	} else {
		id = uint32(len(t.keys))
		t.keys = append(t.keys, k)
		t.refs = append(t.refs, 1)
	}
	t.ids[k] = id
	return id
}

// release drops one reference to id, forgetting the name at zero.
func (t *interner[K]) release(id uint32) {
	t.refs[id]--
	if t.refs[id] > 0 {
		return
	}
	var zero K
	delete(t.ids, t.keys[id])
	t.keys[id] = zero
	t.free = append(t.free, id)
}

func (t *interner[K]) lookup(k K) (uint32, bool) {
	id, ok := t.ids[k]
	return id, ok
}

func (t *interner[K]) key(id uint32) K { return t.keys[id] }

func (t *interner[K]) len() int { return len(t.ids) }

// saName is a service account: namespace and name.
type saName struct{ namespace, name string }

func cloneSAName(s saName) saName {
	return saName{strings.Clone(s.namespace), strings.Clone(s.name)}
}

// uidKey is a pod UID in 16 bytes.
type uidKey [16]byte

// keyOf parses a canonical lower-case UUID (what the apiserver assigns) into
// its 16 bytes. Any other string is hashed, so distinct strings keep distinct
// keys (up to a 2^-128 collision) and a non-canonical spelling of a UUID never
// matches the canonical one.
func keyOf(uid string) uidKey {
	if k, ok := parseUUID(uid); ok {
		return k
	}
	sum := sha256.Sum256([]byte(uid))
	var k uidKey
	copy(k[:], sum[:])
	return k
}

func parseUUID(s string) (uidKey, bool) {
	var k uidKey
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return k, false
	}
	// Offsets of the 16 hex pairs in xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
	offsets := [16]uint8{0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34}
	for n, i := range offsets {
		hi, ok1 := hexVal(s[i])
		lo, ok2 := hexVal(s[i+1])
		if !ok1 || !ok2 {
			return uidKey{}, false
		}
		k[n] = hi<<4 | lo
	}
	return k, true
}

func hexVal(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}
