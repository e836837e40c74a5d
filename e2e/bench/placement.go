package main

import (
	"fmt"

	"github.com/workload-ca/workload-ca/e2e/internal/proc"
)

// placement is where the CA and the load generator run. In production the
// ztunnels asking for certificates run on other machines than the CA, so
// by default each gets its own half of this machine's CPUs ("split"): the
// CA's CPU time per certificate is then the CA's alone, not also the cost
// of sharing its cores with its load. "shared" lets both run anywhere. The
// crypto floor runs on the CA's CPUs, and the control plane anywhere.
type placement struct {
	name           string // "split" or "shared"
	server, client []int  // CPUs; nil: anywhere
}

// choosePlacement returns the placement of mode: "split" gives the CA the
// first half of the CPUs this process may use (the larger half, when
// odd), and the load generator the rest; with one CPU it falls back to
// "shared".
func choosePlacement(mode string) (placement, error) {
	switch mode {
	case "shared":
		return placement{name: "shared"}, nil
	case "split":
	default:
		return placement{}, fmt.Errorf("--placement %q: want split or shared", mode)
	}
	cpus, err := proc.CPUs()
	if err != nil {
		return placement{}, err
	}
	if len(cpus) < 2 {
		return placement{name: "shared"}, nil
	}
	half := (len(cpus) + 1) / 2
	return placement{name: "split", server: cpus[:half], client: cpus[half:]}, nil
}

// describe says where the CA and the load generator run, for the log.
func (p placement) describe() string {
	if p.server == nil {
		return "the CA and the load generator share all CPUs"
	}
	return fmt.Sprintf("the CA on CPUs %v, the load generator on CPUs %v", p.server, p.client)
}
