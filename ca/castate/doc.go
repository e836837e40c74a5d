// Package castate is the CA's durable state: every root the CA knows (the
// one that signs, a prepared next one, retiring old ones) with its key and
// the times of its life cycle, kept in one Kubernetes Secret that every
// replica follows.
//
// It owns: the State type and its invariants (exactly one active
// authority, each a self-signed CA whose key matches); the signing
// material a state gives (the active key, every root in the bundle);
// the Secret format (Encode, Decode); and SecretStore, which creates the
// Secret once (create-if-absent, so replicas racing at start end with one
// root), follows it with an informer and applies read-modify-write
// updates with optimistic concurrency.
//
// It does not own: when to prepare, activate or retire a root (package
// ca/rotation, run by the leader only), how roots are generated (the
// caller passes SecretConfig.Generate, e.g. keystore.GenerateRoot),
// signing (package ca: the caller passes State.Material to
// Authority.SetMaterial in its onChange), publishing the bundle (package
// ca/trustbundle), or metrics.
//
// # The Secret
//
// Type Opaque, label app.kubernetes.io/managed-by=workload-ca, data:
//
//	ca-state.json  {"version": 1, "authorities": [{"status": "active",
//	               "certificate": "<PEM>", "privateKey": "<PKCS#8 PEM>",
//	               "preparedAt": "<RFC 3339>", "activatedAt": "...",
//	               "retiringSince": "..."}, ...]}   oldest first
//	root-cert.pem  every authority's certificate (the trust bundle)
//	ca.crt         the same bundle
//
// Only ca-state.json is read; the other two are conveniences for tools
// that expect the Istio or cert-manager layout, and hold every root
// because a consumer that trusted only the signing root would break at
// each rotation. Other keys and labels someone adds are kept. Decode is
// strict: another version, an unknown field or an encrypted key is
// refused, so an older replica keeps its last state rather than guess.
//
// # RBAC
//
// A Role in the CA's namespace, on core secrets, in two rules:
//
//   - verbs get, list, watch, update with resourceNames: [<name>]. List
//     and watch are authorized by name because the store always sends the
//     field selector metadata.name=<name> (the apiserver then authorizes
//     the request as one for that name);
//   - verb create without resourceNames: create cannot be restricted by
//     name (the name is not known when the request is authorized), so the
//     CA may create any Secret in its namespace. Keep the CA in a
//     namespace of its own.
package castate
