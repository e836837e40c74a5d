// Package podcert signs Kubernetes PodCertificateRequests addressed to the
// CA's signer name, so that pods get X.509-SVIDs through the kubelet's
// podCertificate projected volume, without a mesh agent: the kubelet
// generates the key, asks for a certificate, and mounts the chain and
// renews it; the ClusterTrustBundles of the same signer name (package
// trust/clustertrustbundle) verify it.
//
// It is a front door of the issuance pipeline: it checks a request's
// form (decide), and hands the pipeline a door-neutral request whose node
// rule holds the request to what the cluster runs (the pod live, on the
// kubelet's node, as its service account); the pipeline signs, audits and
// counts it, and the controller writes the outcome to the request's
// status. The identity is the pod's service account, which the API server
// has checked against the pod and its node. Requests for other signers are
// not watched. It runs on the leader only, as the CA's other writers do;
// it does not publish roots.
//
// Requests are read and written in certificates.k8s.io/v1 (Kubernetes
// 1.37) or, where only that is served, v1beta1 (1.35 and 1.36): discovery
// decides when Run starts. A v1beta1 request may carry a 1.35 kubelet's
// key form (a PKIX public key and a proof of possession over the pod's
// UID) instead of a stub CSR; both are decided alike.
//
// Its Options are serve's flags of the PodCertificateRequests (whether to
// sign them, how many at once), checked against the CA's longest lifetime
// and applied to a Config; the signer name is the ClusterTrustBundles'.
package podcert
