//go:build unix && !linux

package controlplane

import "syscall"

// sysProcAttr puts the child in its own process group. Without Pdeathsig
// (Linux only), a SIGKILLed test binary can leave servers behind here.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// killGroup SIGKILLs the process group led by pid.
func killGroup(pid int) error { return syscall.Kill(-pid, syscall.SIGKILL) }
