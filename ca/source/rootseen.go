package source

import (
	"context"
	"crypto/x509"
	"maps"
	"sync"
	"time"

	"github.com/workload-ca/workload-ca/ca/castate"
)

// rootsSeen remembers when each root of the plug-in bundle was first
// seen, to time the move to a new signing root: the rotator activates its
// intermediates only after the propagation delay counted from then
// (rotation.Issuer). This process's own sightings count until the leader's
// record in the Secret (castate.SecretStore.RootsSeen) is adopted, which
// then wins: it dates the root from when a leader first published it, even
// across restarts and failovers. A root that leaves the bundle is
// forgotten, so one that comes back counts again.
type rootsSeen struct {
	mu sync.Mutex
	at map[castate.RootDigest]time.Time
}

// observe records the bundle roots as seen at now, keeping the first
// sighting of those seen before.
func (r *rootsSeen) observe(roots []*x509.Certificate, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := make(map[castate.RootDigest]time.Time, len(roots))
	for _, c := range roots {
		k := castate.DigestOf(c)
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
	if t, ok := r.at[castate.DigestOf(c)]; ok {
		return t
	}
	return now
}

// adopt takes the leader's record for the roots it holds, over this
// process's own sightings.
func (r *rootsSeen) adopt(record map[castate.RootDigest]time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil {
		r.at = make(map[castate.RootDigest]time.Time, len(record))
	}
	maps.Copy(r.at, record)
}

// recordRootsSeen runs on the leader with a plug-in root: it records
// when the plug-in bundle's roots were first seen (by this leader, or kept
// from a predecessor's record) in the CA Secret, and times the move to a
// new signing root from that record, again whenever the directory changes.
// A new leader thus counts the propagation delay from when the root was
// first published, not from its own start. Until the record is read, and
// if it cannot be written, this process's own sightings count: never
// earlier than a leader's, since every replica watches the same directory.
func (s *Source) recordRootsSeen(ctx context.Context) error {
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.rootChanged:
		case <-retry.C:
		}
		root := s.root.Load()
		record, err := s.store.RootsSeen(ctx, root.Roots, s.cfg.Now())
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.Warn("recording when the plug-in roots were first seen; the leader's own sightings count meanwhile", "error", err.Error())
			retry.Reset(5 * time.Second)
			continue
		}
		s.seen.adopt(record)
		s.log.Info("plug-in roots recorded", "roots", len(record), "signing_root", root.Cert.Subject.String(),
			"trusted_from", s.issuer().TrustedFrom)
		s.rotator.Notify()
	}
}
