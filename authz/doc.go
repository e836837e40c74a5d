// Package authz decides which SPIFFE identity an authenticated caller may
// receive. It owns the Caller type produced by authentication, the errors that
// authentication and authorization report, and the node-scoped policy: a
// caller gets its own identity, and a trusted node agent may get the identity
// of a service account that has a pod on the agent's own node.
//
// It does not talk to Kubernetes itself: token review lives in
// authz/tokenreview and the pod index in authz/podindex.
package authz
