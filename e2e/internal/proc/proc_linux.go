package proc

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// terminateSignal is what Terminate sends first.
const terminateSignal = syscall.SIGTERM

// SysProcAttr puts a child in its own process group and has the kernel
// SIGKILL it when the forking thread dies. Start forks from a locked thread
// that lives as long as the child; a caller using it with its own exec.Cmd
// must do the same (runtime.LockOSThread for the child's lifetime).
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup SIGKILLs the process group led by pid.
func killGroup(pid int) error { return syscall.Kill(-pid, syscall.SIGKILL) }

// Gone reports whether pid no longer runs. A zombie counts as gone: whoever
// inherited it may not reap it promptly.
func Gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return os.IsNotExist(err)
	}
	// Format: pid (comm) state ...; comm may contain spaces.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] == 'Z'
}

// setThreadCPUs restricts the calling thread to cpus.
func setThreadCPUs(cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("CPU affinity %v: %w", cpus, err)
	}
	return nil
}

// CPUs returns the CPUs this process may run on.
func CPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("CPU affinity: %w", err)
	}
	var cpus []int
	for c := 0; len(cpus) < set.Count(); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}
