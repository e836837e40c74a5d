package policy

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The IssuancePolicy resource: cluster-scoped, in group workload-ca.io.
const (
	Group    = "workload-ca.io"
	Version  = "v1alpha1"
	Resource = "issuancepolicies"
	Kind     = "IssuancePolicy"
)

// IssuancePolicy selects certificate requests and decides them: allow,
// deny, or lower the lifetime.
type IssuancePolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              Spec   `json:"spec"`
	Status            Status `json:"status,omitempty"`
}

// Spec is what a policy selects and decides.
type Spec struct {
	// DryRun records what the policy would refuse, and refuses nothing
	// and lowers no lifetime.
	DryRun bool `json:"dryRun,omitempty"`
	// Match selects requests; an empty Match selects every request.
	Match Match `json:"match,omitempty"`
	// MatchConditions narrow the selection: a request is selected when
	// every expression is true.
	MatchConditions []MatchCondition `json:"matchConditions,omitempty"`
	// Validations must all be true of a selected request, or it is
	// refused with the first failing one's message.
	Validations []Validation `json:"validations,omitempty"`
	// MaxTTL is an expression giving the longest lifetime (a duration)
	// a selected request's certificate may have.
	MaxTTL string `json:"maxTTL,omitempty"`
}

// Match selects requests by what the CA knows of them without evaluating
// an expression; each empty field selects everything.
type Match struct {
	// Doors: grpc (ztunnel, istio-agent) or podcert (PodCertificateRequests).
	Doors []string `json:"doors,omitempty"`
	// Clusters are cluster ids (the local cluster's, or a remote's).
	Clusters []string `json:"clusters,omitempty"`
	// NamespaceSelector selects the namespace of the identity asked for
	// by its labels.
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// Identities are SPIFFE IDs; a * matches any run of characters
	// except / (path.Match).
	Identities []string `json:"identities,omitempty"`
}

// MatchCondition is a named CEL expression yielding a bool.
type MatchCondition struct {
	Name       string `json:"name"`
	Expression string `json:"expression"`
}

// Validation is a CEL expression yielding a bool, and the message of a
// refusal when it is false.
type Validation struct {
	Expression string `json:"expression"`
	Message    string `json:"message,omitempty"`
}

// Status is what the CA reports of a policy.
type Status struct {
	// ObservedGeneration is the generation the conditions describe.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Compiled (True, or False with the compiler's message).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Decisions counts the requests the policy decided, summed over the
	// CA's replicas since the policy was created.
	Decisions Decisions `json:"decisions,omitempty"`
}

// Decisions counts a policy's decisions.
type Decisions struct {
	// Selected requests: every one the policy decided.
	Selected int64 `json:"selected,omitempty"`
	// Denied by a validation, WouldDeny in dry-run mode, Unavailable
	// because the policy could not decide (it does not compile, or an
	// input was unknown), TTLCapped: those whose lifetime MaxTTL capped.
	Denied      int64 `json:"denied,omitempty"`
	WouldDeny   int64 `json:"wouldDeny,omitempty"`
	Unavailable int64 `json:"unavailable,omitempty"`
	TTLCapped   int64 `json:"ttlCapped,omitempty"`
}

// Add adds o's counts to d.
func (d *Decisions) Add(o Decisions) {
	d.Selected += o.Selected
	d.Denied += o.Denied
	d.WouldDeny += o.WouldDeny
	d.Unavailable += o.Unavailable
	d.TTLCapped += o.TTLCapped
}

// ConditionCompiled is the condition type that says whether a policy
// compiled.
const ConditionCompiled = "Compiled"
