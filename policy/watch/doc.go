// Package watch keeps the CA's issuance policies current: it watches the
// IssuancePolicy resources and the labels of the namespaces and nodes of
// the CA's own cluster, compiles each policy once per generation into the
// Set that decides requests, and writes each policy's status (whether it
// compiled, and the decisions this replica made, added to those of the
// others). Every replica runs it.
//
// It does not decide requests (package policy does) or know any front
// door. It watches no remote cluster's labels: a policy that needs them
// for a remote cluster's request refuses it as unavailable.
package watch
