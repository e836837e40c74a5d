// Package clustertrustbundle publishes the CA's root certificates as
// ClusterTrustBundles (certificates.k8s.io/v1, or v1beta1 when v1 is not
// served; discovery decides once when Run starts), so that pods can mount
// them with a clusterTrustBundle projected volume.
//
// It owns: turning the roots into bundle content (PEM without headers, no
// duplicates, CA certificates only, ordered by NotBefore then DER, at most
// 1 MiB); naming and labelling the bundles; a controller (informer per
// signer, rate-limited workqueue, one reconcile function) that creates the
// bundle, repairs it after someone edits or deletes it, and deletes stale
// bundles it owns; and a start-up check of its RBAC permissions. Informers
// select by the field spec.signerName, which every served version supports
// and which is immutable, so an edited bundle never leaves the selection.
//
// A federated trust domain's roots (Config.PeerTrustDomain) that fail the
// checks (a root not a CA certificate allowed to sign certificates, or
// over 1 MiB) are left out: nothing is written, its bundles stay as they
// were, the reason is logged once and told to Config.LeftOut. Our own
// roots failing them are an error, retried.
//
// Its Options are serve's flags of the ClusterTrustBundles (whether to
// publish, the signer name, Istio's bundle), applied to a Config.
//
// It does not own: where the roots come from or when they change (the
// caller passes Config.Roots and calls Trigger), leader election (only the
// leader should call Run), or metrics registration (see Observer).
//
// # Names and labels
//
// Bundles of Config.SignerName (default workload-ca.io/spiffe) are named
// "<signer with / replaced by :>:<16 hex digits of SHA-256 of the content>",
// e.g. workload-ca.io:spiffe:3f2a9c0d17b4e6a5, like kube-controller-manager's
// clustertrustbundlepublisher. Bundles of a federated trust domain
// (Config.PeerTrustDomain) are named "<signer prefix>:peer-<16 hex digits
// of SHA-256 of "peer-", the trust domain, a newline and the content>", so
// that a peer serving our own roots, or two peers serving the same, never
// share a name with our bundle (the two publishers would relabel it back
// and forth). Bundles of a peer named the old way (hash of the content
// only) carry the peer's labels and are deleted as stale once the new
// one exists; one our publisher had claimed carries our labels and stays
// ours. New content gets a new name: the new bundle
// is created before the old one is deleted, so a pod selecting by signer
// and labels always finds at least one bundle holding the current roots.
//
// With Config.IstioCompatible, the same content is also published as
// istio.io:istiod-ca:root-cert (signer istio.io/istiod-ca), updated in
// place: Istio's charts mount that bundle by name. An existing bundle of
// that name is adopted (its content and our labels are overwritten), so
// neither istiod's own publisher nor a second IstioCompatible CA instance
// may run in the same cluster. If another writer does change the content
// we wrote, the publisher restores it, logs a warning naming the writer
// (its field manager) and counts ResultRepaired; a further change within
// Config.RepairInterval (default a minute) is restored only when the
// interval ends (ResultDeferred), so that the two do not rewrite the
// bundle as fast as the API server allows.
//
// Every bundle carries the labels
//
//	app.kubernetes.io/managed-by: workload-ca
//	workload-ca.io/trust-domain: <trust domain>
//
// A bundle is ours (and deleted when stale) only when both labels match, so
// two CA instances for different trust domains can share a signer, and
// bundles published by anyone else are never touched. Changing the trust
// domain leaves the old bundles behind; delete them by hand.
//
// # Consuming the bundle
//
// Select by signer and trust domain (a missing labelSelector matches
// nothing; the kubelet merges and de-duplicates all matching bundles):
//
//	volumes:
//	- name: spiffe-bundle
//	  projected:
//	    sources:
//	    - clusterTrustBundle:
//	        signerName: workload-ca.io/spiffe
//	        labelSelector:
//	          matchLabels:
//	            workload-ca.io/trust-domain: example.org
//	        path: bundle.pem
//
// Istio's charts use {name: istio.io:istiod-ca:root-cert, path: root-cert.pem}.
//
// # RBAC
//
// The publisher's identity needs, in a ClusterRole:
//
//   - group certificates.k8s.io, resource clustertrustbundles, verbs get,
//     list, watch, create, update, delete (get only when a create finds
//     the bundle already there but not yet in the informer's cache);
//   - group certificates.k8s.io, resource signers, verb attest,
//     resourceNames [workload-ca.io/spiffe] (the configured signer), plus
//     istio.io/istiod-ca with IstioCompatible ("<domain>/*" also works).
//
// Run checks these with SelfSubjectAccessReviews before it starts, and
// returns an error wrapping rbac.ErrPermissionDenied that names what is missing.
package clustertrustbundle
