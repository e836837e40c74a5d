// Package configmap publishes the CA's root certificates as the
// ConfigMap istio-ca-root-cert (key root-cert.pem) in every selected
// namespace, which Istio's sidecars and ztunnel mount to verify the CA's
// serving certificate. It does what istiod's namespace controller and
// cert-manager's istio-csr do for their own roots, for clusters that do
// not use Istio's ClusterTrustBundle support (see package clustertrustbundle).
//
// It owns: turning the roots into the ConfigMap's content (PEM
// "CERTIFICATE" blocks, no duplicates, CA certificates only, ordered by
// NotBefore then DER); a controller (an informer on namespaces, one on
// ConfigMaps named istio-ca-root-cert in all namespaces, a rate-limited
// workqueue keyed by namespace, one worker, one reconcile function) that
// creates the ConfigMap in every selected namespace, including namespaces
// created later, and repairs it after someone edits or deletes it; and a
// start-up check of its RBAC permissions. The ConfigMap informer selects by
// the field metadata.name, which is immutable, so an edited ConfigMap
// never leaves the selection.
//
// Federated trust domains' roots (Config.Peers) join ours one peer at a
// time (rootset.Composition): our roots always go in; a peer whose roots
// include one that is not a CA certificate, whose roots would take the
// content past ContentBudget, or whose roots' name constraints do not keep
// them off our DNS names (rootset.KeepsOffDNS over DefaultDNSDomains and
// Config.OurDNSDomains: a root here also vouches for DNS names, such as
// istiod's) is left out, logged once per change and reported to
// Config.LeftOut.
//
// Its Options are serve's flags of the ConfigMaps (whether to publish,
// which namespaces), checked and applied to a Config.
//
// It does not own: where the roots come from or when they change (the
// caller passes Config.Roots and calls Trigger), leader election (only the
// leader should call Run), metrics registration (see Observer), or
// deleting ConfigMaps. Namespaces that stop matching
// Config.NamespaceSelector, or whose ConfigMap we no longer want, keep the
// ConfigMap until someone deletes it; namespaces being deleted are left
// alone (the namespace's deletion removes the ConfigMap).
//
// # Istio
//
// Each namespace's ConfigMap is updated in place. A ConfigMap of that name
// published by someone else is adopted: root-cert.pem and our labels are
// overwritten, other keys and labels are kept. So istiod's own root
// publisher (its namespace controller), istio-csr's, or a second CA
// instance must not run beside this one: each would overwrite the other's
// content on every event. Configure istiod not to publish the ConfigMap,
// as the istio-csr installation does. If another writer does change the
// roots we wrote, the publisher restores them, logs a warning naming the
// writer (its field manager, such as istiod's pilot-discovery) and counts
// ResultRepaired; a further change within Config.RepairInterval (default
// a minute) is restored only when the interval ends (ResultDeferred), so
// that the two do not rewrite the ConfigMap as fast as the API server
// allows.
//
// Istio's namespace controller skips kube-system, kube-public and
// kube-node-lease and honours the mesh's discoverySelectors; this package
// publishes wherever Config.NamespaceSelector (nil: every namespace)
// matches the namespace's labels.
//
// # Labels
//
// Every ConfigMap carries
//
//	app.kubernetes.io/managed-by: workload-ca
//	workload-ca.io/trust-domain: <trust domain>
//	istio.io/config: "true"
//
// the last being the label istiod puts on the ConfigMaps it publishes.
//
// # RBAC
//
// The publisher's identity needs, bound with a ClusterRoleBinding (all
// namespaces), a ClusterRole with these rules in the core API group (""):
//
//	rules:
//	- apiGroups: [""]
//	  resources: [configmaps]
//	  verbs: [get, list, watch, update]
//	  resourceNames: [istio-ca-root-cert]
//	- apiGroups: [""]
//	  resources: [configmaps]
//	  verbs: [create]
//	- apiGroups: [""]
//	  resources: [namespaces]
//	  verbs: [list, watch]
//
// Create cannot be restricted by name (the apiserver authorizes it before
// it knows the name), hence its own rule; list and watch work with
// resourceNames because the informer selects by metadata.name. Rules
// without resourceNames grant more and pass too. Get is used only when a
// create finds the ConfigMap already there but not yet in the informer's
// cache.
//
// Run checks these with SelfSubjectAccessReviews before it starts, and
// returns an error wrapping rbac.ErrPermissionDenied that names what is missing.
package configmap
