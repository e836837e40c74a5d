package controlplane

import "syscall"

// sysProcAttr puts the child in its own process group and has the kernel
// SIGKILL it when the forking thread (see startProcess) dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup SIGKILLs the process group led by pid.
func killGroup(pid int) error { return syscall.Kill(-pid, syscall.SIGKILL) }
