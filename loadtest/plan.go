package loadtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Ztunnel is one simulated node agent of a plan.
type Ztunnel struct {
	// Token is the node agent's bearer token.
	Token string `json:"token"`
	// Identities are the SPIFFE IDs it asks certificates for.
	Identities []string `json:"identities"`
	// ClusterID is sent in the clusterid header (ztunnel's CLUSTER_ID);
	// empty is Istio's default, Kubernetes.
	ClusterID string `json:"clusterId,omitempty"`
}

// Plan is the ztunnels of a load test.
type Plan []Ztunnel

// ParsePlan reads a plan (see the package comment) and checks it: at least
// one ztunnel, each with a token without white space and at least one
// valid SPIFFE ID; nothing after the array.
func ParsePlan(r io.Reader) (Plan, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var p Plan
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("plan: data after the JSON array")
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// ReadPlanFile parses the plan in file path.
func ReadPlanFile(path string) (Plan, error) {
	f, err := os.Open(filepath.Clean(path))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParsePlan(f)
}

func (p Plan) validate() error {
	if len(p) == 0 {
		return errors.New("plan: no ztunnels")
	}
	for i, z := range p {
		if z.Token == "" || strings.ContainsAny(z.Token, " \t\r\n") {
			return fmt.Errorf("plan: ztunnel %d: token is empty or holds white space", i)
		}
		if strings.ContainsAny(z.ClusterID, " \t\r\n") {
			return fmt.Errorf("plan: ztunnel %d: clusterId holds white space", i)
		}
		if len(z.Identities) == 0 {
			return fmt.Errorf("plan: ztunnel %d: no identities", i)
		}
		for _, id := range z.Identities {
			if _, err := spiffeid.FromString(id); err != nil {
				return fmt.Errorf("plan: ztunnel %d: identity %q: %w", i, id, err)
			}
		}
	}
	return nil
}

// Limit returns the first n ztunnels of p (all of them when n <= 0).
func (p Plan) Limit(n int) Plan {
	if n <= 0 || n >= len(p) {
		return p
	}
	return p[:n]
}

// Identities counts the identities of every ztunnel.
func (p Plan) Identities() int {
	n := 0
	for _, z := range p {
		n += len(z.Identities)
	}
	return n
}
