// Package trust is the shell both trust publishers run in: the settings
// they share and their defaults, one run at a time on the leader with a
// full reconcile when it starts and every resync period, the outcome of
// each reconcile reported to an Observer, and the write-or-repair step for
// one published object (Writer), which restores content another writer
// changed at most once per repair interval, and the report of federated
// trust domains a target leaves out (LeftOutReport), logged and told
// once per change.
//
// The targets are packages of their own, each a small implementation of
// what it publishes to: clustertrustbundle (ClusterTrustBundles, one or
// two signers) and configmap (Istio's istio-ca-root-cert in every selected
// namespace). A new target brings its Target (informers and keys,
// reconcile of one key) and its Objects (read, create, update of one
// object kind); it does not copy the loop, the results or the repair.
package trust
