// Package castate is the CA's durable state: every CA certificate the CA
// knows (the one that signs, a prepared next one, retiring old ones) with
// its key and the times of its life cycle, kept in one Kubernetes Secret
// that every replica follows. The certificates are either self-signed
// roots (KindRoots) or intermediates issued by a plug-in root CA
// (KindIntermediates; see below).
//
// It owns: the State type and its invariants (exactly one active
// authority, each a CA whose key matches: self-signed, or issued by one
// of the external roots); the signing material a state gives (the active
// key, and every root or the external roots as the bundle);
// the Secret format (Encode, Decode); and SecretStore, which creates the
// Secret once (create-if-absent, so replicas racing at start end with one
// root), follows it with an informer and applies read-modify-write
// updates with optimistic concurrency.
//
// It does not own: when to prepare, activate or retire a root (package
// ca/rotation, run by the leader only), how roots are generated (the
// caller passes SecretConfig.Generate, e.g. keystore.GenerateRoot or
// keystore.GenerateIntermediate), where external roots come from
// (keystore.LoadRootDir),
// signing (package ca: the caller passes State.Material to
// Authority.SetMaterial in its onChange), publishing the bundle (package
// trust/clustertrustbundle), or metrics.
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
//	roots-seen.json  with a plug-in root: {"version": 1, "roots":
//	               [{"sha256": "<hex of the DER>", "firstSeen": "<RFC 3339>"}]},
//	               when a leader first saw each root of the plug-in
//	               bundle (SecretStore.RootsSeen)
//
// With intermediates, ca-state.json also has "kind": "intermediates" (a
// replica that predates kinds refuses it as an unknown field, rather than
// take intermediates for roots), and root-cert.pem and ca.crt are not
// written.
//
// The state is read from ca-state.json only; roots-seen.json is a
// separate key so that replicas without it keep reading the state.
// root-cert.pem and ca.crt are conveniences for tools
// that expect the Istio or cert-manager layout, and hold every root
// because a consumer that trusted only the signing root would break at
// each rotation. Other keys and labels someone adds are kept. Decode is
// strict: another version, an unknown field or an encrypted key is
// refused, so an older replica keeps its last state rather than guess.
//
// # Intermediates under a plug-in root
//
// The operator supplies a root CA and its key (--ca-root-dir); the CA
// mints its own intermediates from it and keeps them, their keys and the
// rotation state in the Secret, exactly like self-signed roots. The root's
// key is never written to the Secret, and neither are the roots'
// certificates: every replica reads the roots from the same directory
// (the chart mounts the same root Secret in every pod) and passes them as
// SecretConfig.Roots and to State.MaterialUnder. That keeps the directory
// the one source of the bundle, with nothing to keep in sync; the price
// is that every replica needs the directory, and that a replica whose
// directory lacks the root of some intermediate in the Secret refuses the
// state (at start: it does not start), which is what keeps an operator
// from dropping a root whose intermediates' leaves are still in use. When
// the directory changes, SecretStore.SetRoots takes the new roots under
// the same rule.
//
// The signing material is then the active intermediate, no further
// intermediates, and the external roots as the bundle, so every chain the
// CA returns is [leaf, intermediate, roots]. Prepared and retiring
// intermediates are in no chain and in no bundle.
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
