// Package controlplane starts a real etcd and kube-apiserver on 127.0.0.1
// for end-to-end tests and for `make demo`.
//
// The binaries are built from pinned Go modules (see e2e/tools) into a
// directory named by Options.BinDir or the WORKLOAD_CA_CONTROLPLANE_BIN
// environment variable. No kube-controller-manager, scheduler or kubelet
// runs: tests create Node objects and Pods with spec.nodeName set (they stay
// Pending), mint pod-bound tokens with the TokenRequest API and act as a
// kubelet by impersonating system:node:<node> (see NodeConfig).
//
// We use this harness instead of controller-runtime's envtest for two
// reasons: the product module should not depend on controller-runtime, and a
// killed test run must not leave servers behind. Both servers are started
// by e2e/internal/proc: their own process group with Pdeathsig=SIGKILL
// (Linux), set from a goroutine locked to its OS thread for the life of the
// process, so the servers die with the test binary even when it is
// SIGKILLed. Stop kills both process
// groups and waits for them.
//
// Choices worth knowing:
//
//   - Authentication: the admin identity is a client certificate (CN admin,
//     O system:masters) issued by a CA generated in Go at start-up; the
//     same CA signs the serving certificate (SANs 127.0.0.1, localhost).
//     Service-account tokens are signed with an ECDSA P-256 key (ES256)
//     that the harness keeps, so tests can re-sign tokens (ResignToken,
//     ExpireToken).
//   - The issuer is https://kubernetes.default.svc and --api-audiences is
//     "https://kubernetes.default.svc,istio-ca", as in a cluster where the
//     CA reviews tokens with audience istio-ca.
//   - Admission: the default plugin set plus NodeRestriction. The
//     ServiceAccount plugin stays enabled, as in real clusters: a pod's
//     service account must exist before the pod is created (nothing creates
//     the "default" service account here, since kube-controller-manager does
//     not run), and admitted pods get the usual projected token volume,
//     which is harmless without a kubelet. Override with
//     ExtraAPIServerFlags["disable-admission-plugins"] = "ServiceAccount".
//   - Audit: by default only TokenReview requests are logged, at Metadata
//     level, to <WorkDir>/audit.log; CountAudit and AuditEvents read it.
//   - Token lifetimes: the TokenRequest API rejects expirationSeconds below
//     600 (hard-coded validation) and --service-account-max-token-expiration
//     cannot be set below 1h, so short-lived tokens cannot be minted; use
//     ExpireToken to get a validly signed, already expired copy of a real
//     token. Because istio-ca is one of the API audiences, a request for
//     exactly 3607 seconds (what the kubelet asks for) is silently extended
//     to one year (--service-account-extend-token-expiration, default true).
//
// Server logs go to <WorkDir>/etcd.log and <WorkDir>/kube-apiserver.log unless
// Options.Stdout/Stderr are set; errors from Start include the log tail.
package controlplane
