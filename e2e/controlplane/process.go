package controlplane

import (
	"errors"
	"fmt"
	"strings"

	"github.com/workload-ca/workload-ca/e2e/internal/proc"
)

// errAddrInUse reports that a server could not bind a port that was free a
// moment before; Start retries with fresh ports.
var errAddrInUse = errors.New("address already in use")

// exitError describes an unexpected exit of p, with the tail of its output.
func exitError(p *proc.Process) error {
	out := p.Tail()
	err := fmt.Errorf("%w during start-up; last output:\n%s", p.ExitError(), out)
	if strings.Contains(out, "address already in use") {
		return fmt.Errorf("%w: %w", errAddrInUse, err)
	}
	return err
}
