package main

import (
	"crypto/sha256"
	"crypto/x509"
	"sync"
	"time"
)

// rootsSeen remembers when this process first saw each root of the
// plug-in bundle, to time the move to a new signing root: the rotator
// activates its intermediates only after the propagation delay counted
// from then (rotation.Issuer). A root that leaves the bundle is forgotten,
// so one that comes back counts again.
type rootsSeen struct {
	mu sync.Mutex
	at map[[sha256.Size]byte]time.Time
}

// observe records the bundle roots as seen at now, keeping the first
// sighting of those seen before.
func (r *rootsSeen) observe(roots []*x509.Certificate, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := make(map[[sha256.Size]byte]time.Time, len(roots))
	for _, c := range roots {
		k := sha256.Sum256(c.Raw)
		if t, ok := r.at[k]; ok {
			at[k] = t
		} else {
			at[k] = now
		}
	}
	r.at = at
}

// since returns when c was first seen in the bundle; a root not in it
// counts from now.
func (r *rootsSeen) since(c *x509.Certificate, now time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.at[sha256.Sum256(c.Raw)]; ok {
		return t
	}
	return now
}
