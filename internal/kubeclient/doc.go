// Package kubeclient builds the CA's Kubernetes API clients, one per kind
// of work, each with a rate limit and a user agent of its own (Clients),
// from the --kubeconfig and rate limit flags (Options) or, for a remote
// cluster, from its configuration (For).
//
// It does not decide what the clients do: each component takes the one it
// needs.
package kubeclient
