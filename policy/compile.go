package policy

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/ext"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/workload-ca/workload-ca/issuance"
)

// Bounds of a policy: an expression's length and cost, and how many of
// each field a policy may have. The custom resource's schema holds the
// same; they are checked here too, for the resource is input the CA does
// not trust blindly.
const (
	MaxExpressionLength = 4096
	MaxMatchConditions  = 8
	MaxValidations      = 16
	MaxMatchValues      = 64
	MaxMessageLength    = 512
	// MaxCost bounds one expression's evaluation (cel-go's cost units:
	// about one per operation, and per byte of a string compared), and
	// MaxRequestCost all the expressions one request is decided by.
	MaxCost        = 100_000
	MaxRequestCost = 1_000_000
	// maxRefusalMessage bounds what of a refusal's message the caller
	// and the audit record get.
	maxRefusalMessage = 512
)

// scalarVariables are the variables an expression sees of the request and
// the identity it was granted, with their index in a request's values;
// the labels of its namespace and node are looked up only when an
// expression reads them.
var scalarVariables = [...]string{"door", "cluster", "callerKind", "callerNamespace", "callerServiceAccount",
	"credential", "identity", "trustDomain", "identityNamespace", "identityServiceAccount", "pod", "node", "ttl"}

// variableIndex is name's index in scalarVariables, or -1.
func variableIndex(name string) int {
	for i, v := range scalarVariables {
		if v == name {
			return i
		}
	}
	return -1
}

// variables declares them all to CEL.
func variables() []cel.EnvOption {
	opts := []cel.EnvOption{
		cel.Variable("namespaceLabels", cel.MapType(cel.StringType, cel.StringType)),
		cel.Variable("nodeLabels", cel.MapType(cel.StringType, cel.StringType)),
	}
	for _, name := range scalarVariables {
		t := cel.StringType
		if name == "ttl" {
			t = cel.DurationType
		}
		opts = append(opts, cel.Variable(name, t))
	}
	return opts
}

// Compiler compiles policies; one is shared by all of them.
type Compiler struct {
	env *cel.Env
}

// NewCompiler returns a compiler.
func NewCompiler() (*Compiler, error) {
	opts := append([]cel.EnvOption{ext.Strings(), cel.OptionalTypes()}, variables()...)
	env, err := cel.NewEnv(opts...)
	if err != nil {
		return nil, fmt.Errorf("policy: CEL environment: %w", err)
	}
	return &Compiler{env: env}, nil
}

// Compiled is a policy ready to decide, or the reason it is not (Err):
// then it refuses, as unavailable, what its Match selects.
type Compiled struct {
	Name       string
	UID        string
	Generation int64
	DryRun     bool
	Err        error

	doors, clusters []string
	identities      []string
	namespaces      labels.Selector // nil: every namespace
	conditions      []program
	validations     []program
	maxTTL          *program
}

type program struct {
	source  string // the field, for messages: validations[2]
	message string
	prg     cel.Program
	// maxCost is the most an evaluation can cost, when it is known at
	// compile time (then the program tracks no cost as it runs: that
	// tracking costs more than most expressions); zero when it is not,
	// and the program stops itself at MaxCost.
	maxCost uint64
	// static, when set, decides the expression without the interpreter
	// (staticTerms).
	static []staticTerm
}

// Compile compiles p. It never fails: a policy that does not compile
// comes back with Err set, and selects by what of Match could be read.
func (c *Compiler) Compile(p *IssuancePolicy) *Compiled {
	out := &Compiled{Name: p.Name, UID: string(p.UID), Generation: p.Generation, DryRun: p.Spec.DryRun}
	m := p.Spec.Match
	var errs []error
	if err := checkMatch(m); err != nil {
		// The lists cannot be read: a policy that does not compile
		// selects more, never less.
		errs = append(errs, err)
	} else {
		out.doors, out.clusters, out.identities = m.Doors, m.Clusters, m.Identities
	}
	if m.NamespaceSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(m.NamespaceSelector)
		if err != nil {
			errs = append(errs, fmt.Errorf("match.namespaceSelector: %w", err))
		} else if !sel.Empty() {
			out.namespaces = sel
		}
	}
	if len(p.Spec.MatchConditions) > MaxMatchConditions {
		errs = append(errs, fmt.Errorf("matchConditions: %d, at most %d", len(p.Spec.MatchConditions), MaxMatchConditions))
	}
	for i, mc := range p.Spec.MatchConditions {
		prg, err := c.program(fmt.Sprintf("matchConditions[%d] (%s)", i, mc.Name), mc.Expression, cel.BoolType)
		errs = append(errs, err)
		out.conditions = append(out.conditions, prg)
	}
	if len(p.Spec.Validations) > MaxValidations {
		errs = append(errs, fmt.Errorf("validations: %d, at most %d", len(p.Spec.Validations), MaxValidations))
	}
	for i, v := range p.Spec.Validations {
		prg, err := c.program(fmt.Sprintf("validations[%d]", i), v.Expression, cel.BoolType)
		errs = append(errs, err)
		if len(v.Message) > MaxMessageLength {
			errs = append(errs, fmt.Errorf("validations[%d].message: %d bytes, at most %d", i, len(v.Message), MaxMessageLength))
		}
		prg.message = v.Message
		if prg.message == "" {
			prg.message = issuance.Clip("failed "+v.Expression, maxRefusalMessage)
		}
		out.validations = append(out.validations, prg)
	}
	if p.Spec.MaxTTL != "" {
		prg, err := c.program("maxTTL", p.Spec.MaxTTL, cel.DurationType)
		errs = append(errs, err)
		out.maxTTL = &prg
	}
	out.Err = errors.Join(errs...)
	return out
}

// program compiles one expression that must yield want.
func (c *Compiler) program(source, expr string, want *cel.Type) (program, error) {
	p := program{source: source}
	if len(expr) > MaxExpressionLength {
		return p, fmt.Errorf("%s: %d bytes, at most %d", source, len(expr), MaxExpressionLength)
	}
	ast, iss := c.env.Compile(expr)
	if iss.Err() != nil {
		return p, fmt.Errorf("%s: %w", source, iss.Err())
	}
	if !ast.OutputType().IsExactType(want) {
		return p, fmt.Errorf("%s: yields %s, not %s", source, ast.OutputType(), want)
	}
	if want == cel.BoolType {
		p.static, _ = staticTerms(ast.NativeRep().Expr())
	}
	opts := []cel.ProgramOption{cel.EvalOptions(cel.OptOptimize)}
	if est, err := c.env.EstimateCost(ast, sizes{}); err == nil && est.Max <= MaxCost {
		// Bounded whatever the request, given the sizes the API server
		// and the CA enforce on its inputs (sizes).
		p.maxCost = max(est.Max, 1)
	} else {
		opts = append(opts, cel.CostLimit(MaxCost), cel.InterruptCheckFrequency(100))
	}
	prg, err := c.env.Program(ast, opts...)
	if err != nil {
		return p, fmt.Errorf("%s: %w", source, err)
	}
	p.prg = prg
	return p, nil
}

// sizes bounds the inputs of an expression for the estimate of its cost
// (checker.CostEstimator): the longest strings and largest maps a request
// can bring, as Kubernetes and the CA validate them. Names are DNS
// subdomains (253) or labels (63); the identity granted is
// spiffe://<trust domain>/ns/<namespace>/sa/<service account>; a label key
// is at most 317 bytes, a value 63, and an object (its labels) 1.5 MiB.
type sizes struct{}

func (sizes) EstimateSize(n checker.AstNode) *checker.SizeEstimate {
	path := n.Path()
	if len(path) == 0 {
		return nil
	}
	bound := func(m uint64) *checker.SizeEstimate { return &checker.SizeEstimate{Min: 0, Max: m} }
	switch path[0] {
	case "door", "callerKind", "credential":
		return bound(16)
	case "identityNamespace", "callerNamespace":
		return bound(63)
	case "cluster", "callerServiceAccount", "identityServiceAccount", "pod", "node", "trustDomain":
		return bound(255)
	case "identity":
		return bound(uint64(len("spiffe:///ns//sa/") + 255 + 63 + 253))
	case "namespaceLabels", "nodeLabels":
		switch {
		case len(path) == 1:
			return bound(1 << 20) // entries: 1.5 MiB holds fewer
		case path[1] == "@keys":
			return bound(317)
		case path[1] == "@values":
			return bound(63)
		}
	}
	return nil
}

func (sizes) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}

// checkMatch checks Match's lists: bounded, known doors, well-formed
// patterns.
func checkMatch(m Match) error {
	var errs []error
	for name, list := range map[string][]string{"doors": m.Doors, "clusters": m.Clusters, "identities": m.Identities} {
		if len(list) > MaxMatchValues {
			errs = append(errs, fmt.Errorf("match.%s: %d values, at most %d", name, len(list), MaxMatchValues))
		}
	}
	for _, d := range m.Doors {
		if d != "grpc" && d != "podcert" {
			errs = append(errs, fmt.Errorf("match.doors: %q is not a door (grpc, podcert)", d))
		}
	}
	for _, id := range m.Identities {
		if _, err := path.Match(id, ""); err != nil {
			errs = append(errs, fmt.Errorf("match.identities: %q: %w", id, err))
		}
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return errors.Join(errs...)
}

// selects reports whether the policy's Match selects a request, given
// what it names; namespaceLabels is asked only when a selector needs it.
func (c *Compiled) selects(door, cluster, identity string, namespaceLabels func() (labels.Set, error)) (bool, error) {
	if len(c.doors) > 0 && !slices.Contains(c.doors, door) {
		return false, nil
	}
	if len(c.clusters) > 0 && !slices.Contains(c.clusters, cluster) {
		return false, nil
	}
	if len(c.identities) > 0 && !slices.ContainsFunc(c.identities, func(p string) bool {
		ok, _ := path.Match(p, identity)
		return ok
	}) {
		return false, nil
	}
	if c.namespaces == nil {
		return true, nil
	}
	set, err := namespaceLabels()
	if err != nil {
		return false, err
	}
	return c.namespaces.Matches(set), nil
}
