// Package podindex answers the node-scoped policy's questions about pods
// (authz.Pods): is this UID a live pod, where does it run, and does a
// service account have a live pod on a given node.
//
// It owns:
//   - a reflector that lists and watches scheduled, non-terminal pods in all
//     namespaces (field selector spec.nodeName!=, status.phase not Failed or
//     Succeeded), feeding a store that keeps no objects, only a compact index:
//     pod UID (16 bytes) → (node id, namespace/service account id); per node,
//     a short list of (service account id, live pod count, terminating
//     count); and
//     reference-counted interning tables whose ids are reused when a node or
//     service account has no pods left. About 64 bytes of heap per pod at
//     150,000 pods (BenchmarkIndexMemory);
//   - a transform that cuts pods down while the initial list is held in
//     memory, so the startup peak is a few hundred bytes per pod, not ~17 KB;
//   - the live fallback for informer lag: on an index miss, and only then,
//     one rate-limited, time-bounded GET or LIST decides. Each caller (the
//     node, or the namespace of a caller's own pod) has its own share of the
//     lookups besides the index's total; a lookup either budget refuses is
//     an *authz.OverloadError (come back later: neither not-found nor
//     cached); an API error wraps authz.ErrUnavailable. Looked-up pods are
//     not added to the index.
//
// It does not own the policy (package authz), token review, metrics
// registration (Stats exposes the numbers), or readiness wiring (HasSynced
// and WaitForSync expose the state). It needs list and watch on pods
// cluster-wide, and get/list for the fallback.
package podindex
