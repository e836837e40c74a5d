// Package leader runs the leader's tasks (the writers: rotation, trust
// publishing, pod certificates) under a coordination.k8s.io Lease, so
// that of several replicas one writes at a time, and hands the Lease over
// only once its tasks have returned. A failed task is restarted after a
// backoff while this replica leads.
//
// It does not decide what the tasks are (the components say whether they
// are leader-only), nor run the work every replica does.
package leader
