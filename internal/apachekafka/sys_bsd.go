//go:build unix && !linux

package apachekafka

import "syscall"

// sysProcAttr puts a JVM in a process group of its own. Without Linux's
// Pdeathsig, a broker outlives a Go process killed with SIGKILL; Stop and
// the devstack's signal handling kill it in every other case.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
