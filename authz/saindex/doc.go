// Package saindex is a compact index of the cluster's service accounts:
// namespace/name → UID and deletionTimestamp, fed by a reflector that
// keeps no objects. Local token verification (authz/tokenreview) reads it
// to tell, as the API server does, whether the service account a token
// names still exists with the UID the token carries: a service account
// deleted and created again under its name has a new UID, and the old
// tokens stop being valid.
//
// It does not own the token checks (authz/tokenreview), metrics or
// readiness wiring (HasSynced exposes the state). It needs list and watch
// on serviceaccounts cluster-wide.
package saindex
