// Package podcert signs Kubernetes PodCertificateRequests addressed to the
// CA's signer name, so that pods get X.509-SVIDs through the kubelet's
// podCertificate projected volume, without a mesh agent: the kubelet
// generates the key, asks for a certificate, and mounts the chain and
// renews it; the ClusterTrustBundles of the same signer name (package
// trustbundle) verify it.
//
// The identity is the pod's service account, which the API server has
// checked against the pod and its node. Requests for other signers are
// not watched. It runs on the leader only, as the CA's other writers do;
// it does not publish roots.
package podcert
