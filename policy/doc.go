// Package policy is issuance policy: the IssuancePolicy custom resource's
// types, their compilation (CEL expressions, compiled once per policy
// generation, the way Kubernetes' ValidatingAdmissionPolicy compiles its
// own), and the decision of a request against every policy installed
// (Set, an issuance.Policy). A policy selects requests by door, cluster,
// namespace labels and identity, then by CEL match conditions; it refuses
// what fails one of its validations and can lower the certificate's
// lifetime. A policy in dry-run mode only records what it would refuse;
// one that does not compile refuses, as unavailable, what it selects.
//
// It owns the per-policy counts of decisions (for the policies' status
// and metrics). It does not watch the API server or write status (package
// policy/watch does), know any front door's transport, or sign.
package policy
