//go:build unix && !linux

package proc

import (
	"errors"
	"fmt"
	"syscall"
)

// terminateSignal is what Terminate sends first.
const terminateSignal = syscall.SIGTERM

// SysProcAttr puts a child in its own process group. Without Pdeathsig
// (Linux only), a SIGKILLed test binary can leave its children behind here.
func SysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// killGroup SIGKILLs the process group led by pid.
func killGroup(pid int) error { return syscall.Kill(-pid, syscall.SIGKILL) }

// Gone reports whether pid no longer runs (zombies count as running here).
func Gone(pid int) bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }

// setThreadCPUs fails: CPU placement is Linux only here.
func setThreadCPUs(cpus []int) error {
	return fmt.Errorf("CPU affinity %v: only on Linux", cpus)
}

// CPUs fails: CPU placement is Linux only here.
func CPUs() ([]int, error) { return nil, errors.New("CPU affinity: only on Linux") }
