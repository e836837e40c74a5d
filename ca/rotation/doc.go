// Package rotation decides when the CA's root is replaced, and drives the
// replacement on the leader, the way SPIRE's server CA rotator does: the
// next root (a new key, a new self-signed certificate) is prepared well
// before the active one ends and published in the bundle first; it starts
// signing only after the bundle has carried it long enough for every
// verifier to learn it; the old root stays in the bundle until the last
// leaf it signed has expired, then it is removed.
//
// It owns: the Policy and its validation; Plan and Apply, pure functions
// from a castate.State and a time to the next step and its result; and the
// Rotator, a loop on an injected clock that takes each step when it is due
// through a Store (castate.SecretStore), planning again on the fresh state
// inside the update so that two leaders racing never take a step twice.
// The whole rotation lives in the state, so a new leader resumes it.
//
// It does not own: where the state is kept or how replicas follow it
// (ca/castate), how roots are generated (Config.Generate), leader
// election (the caller runs Run only while leading), publishing the bundle
// (trust/clustertrustbundle publishes whatever the roots are), or metrics
// registration (see Observer).
//
// # The default policy
//
//   - CATTL 2 years. A rotation that happens once a decade (Istio's
//     10-year self-signed root) is never exercised and fails when it
//     finally comes; SPIRE rotates daily, which needs a bundle every
//     verifier re-reads daily. With the SPIRE fractions the old root hands
//     over at 5/6 of its life, (1 − 5/6) × 730 days ≈ 122 days before it
//     ends: it outlives every leaf it signed for any --max-ttl up to that
//     (the default is 24 hours). Roots rotate every ~20 months.
//   - PrepareAt 1/2, ActivateAt 5/6, as SPIRE: a new root spends a third
//     of a root's life (~243 days) in the bundle before it signs.
//   - PropagationDelay 24 hours, the floor for when a root is prepared
//     late (a leader was down). The kubelet refreshes projected
//     clusterTrustBundle volumes in about a minute, but ztunnel and
//     istio-agent take the roots from the CA's own responses, and renew at
//     half their certificate's life: 12 hours for the default 24-hour
//     leaf; doubled for margin. Raise it with the CA's default TTL.
//   - LeafMaxTTL 24 hours, ca.DefaultMaxTTL: it must be at least the CA's
//     MaxTTL, or leaves could outlive their root's place in the bundle.
//   - SkewMargin 1 hour, for clock skew between hosts and replicas that
//     switch signer a little after the Secret changes.
//
// # Upstream intermediates
//
// For intermediates an upstream CA issued (castate.KindUpstream), the
// lifetime the fractions apply to ends at the first expiry of the
// intermediate and its upstream chain (ChainNotAfter): an upstream root
// that expires first ends the intermediate's use. PropagationDelay applies
// only when the successor chains to a new anchor.
//
// # Intermediates under a plug-in root
//
// When the state holds intermediates issued by an operator's root
// (castate.KindIntermediates), the same steps rotate the intermediate, on
// the same fractions of its lifetime (--ca-ttl, cut at the root's expiry),
// with one difference: no PropagationDelay (see Policy.ForKind). The trust
// bundle is the plug-in roots and does not change; every chain the CA
// returns is [leaf, intermediate, roots], so a peer verifies a leaf of a
// freshly activated intermediate with the roots it already has. The
// retiring intermediate is in no bundle, but stays in the state until its
// last leaf has expired (RetiringSince + LeafMaxTTL + SkewMargin), for the
// record and so that its root is not dropped while it matters (castate
// refuses a state whose intermediates the roots no longer issued).
//
// Rolling the plug-in root is the operator's: add the new root to the
// bundle (root-cert.pem, after the signing root), then make it the
// signing root (first in root-cert.pem, its key in root-key.pem); every
// replica reloads the directory. The rotator then moves to it without
// waiting for the scheduled rotation (see PlanUnder): it prepares an
// intermediate of the new root at once and activates it when the new
// root has been in the bundle for PropagationDelay, as the caller
// measures it (Config.Issuer; the CA counts from when a leader first saw
// the root in the directory, as recorded in the CA Secret, so a restart or
// a failover does not count again). Once no
// intermediate of the old root is left in the state, the operator removes
// the old root.
//
// # Limits
//
// Plan trusts the wall clock: a clock set forward makes steps due early
// (a root could sign before its propagation delay, or leave the bundle
// while leaves it signed are valid); a clock set back only delays steps.
// PropagationDelay counts from when the root entered the Secret, not from
// when a ClusterTrustBundle holding it was written.
package rotation
