package issuance

import (
	"context"
	"crypto/x509"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/authz"
)

// The names of the front doors: the door label of the metrics and the door
// of an audit record.
const (
	DoorGRPC           = "grpc"
	DoorPodCertificate = "podcert"
)

// CallerKind is who asks.
type CallerKind string

// The kinds of caller.
const (
	// CallerWorkload asks for its own identity.
	CallerWorkload CallerKind = "workload"
	// CallerNodeAgent asks for an identity not its own, as a node agent
	// (ztunnel) does for the workloads on its node; the node rule decides
	// whether it is one.
	CallerNodeAgent CallerKind = "node-agent"
	// CallerKubelet asks, through a PodCertificateRequest, for a pod on
	// its node.
	CallerKubelet CallerKind = "kubelet"
)

// Credential is the kind of credential a request asks for.
type Credential string

// CredentialX509SVID is an X.509-SVID, the only kind issued today.
const CredentialX509SVID Credential = "x509-svid"

// Request is what a door hands the pipeline: who asks, in which cluster,
// for what, and within which bounds. Nothing in it is transport.
type Request struct {
	// Caller is the workload the request is for: its namespace and
	// service account, its pod and node (for a node agent, the agent's
	// own; for a kubelet, the pod's).
	Caller     authz.Caller
	CallerKind CallerKind
	// Cluster is the caller's cluster, when the CA knows cluster ids.
	Cluster string
	// Requested is the identity asked for; zero asks for the caller's own.
	Requested  spiffeid.ID
	Credential Credential
	// Object names what the door decided on, for the record (a
	// PodCertificateRequest's namespace/name); empty for the gRPC door.
	Object string
	// CSR carries the key to certify; its signature is verified.
	CSR *x509.CertificateRequest
	// TTL is the lifetime asked for (zero: the CA's default);
	// MaxValidity, if set, caps the certificate's lifetime whatever the
	// CA's maximum; MinValidity, if set, is the shortest lifetime the door
	// can hand out: a shorter certificate (its signing certificate ends
	// sooner) is not handed out, and the request is unavailable.
	TTL, MaxValidity, MinValidity time.Duration
	// Received is when the door received the request: the record's
	// took_seconds counts from it (zero: from when the pipeline got it).
	Received time.Time
	// Admit, if set, runs the signature within the door's bounds (its
	// share of the CPU); nil signs at once.
	Admit func(ctx context.Context, sign func() error) error
}

// Rule is a door's node rule: the identity a request may have, or a
// refusal (an *authz.DenyError, or an error wrapping authz.ErrUnavailable
// when it cannot tell now).
type Rule interface {
	Grant(ctx context.Context, r *Request) (spiffeid.ID, error)
}

// RuleFunc adapts a function to Rule.
type RuleFunc func(ctx context.Context, r *Request) (spiffeid.ID, error)

// Grant calls f.
func (f RuleFunc) Grant(ctx context.Context, r *Request) (spiffeid.ID, error) { return f(ctx, r) }
