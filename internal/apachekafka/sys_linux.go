package apachekafka

import "syscall"

// sysProcAttr puts a JVM in a process group of its own (so that a signal
// reaches all of it and none of ours) and has the kernel kill it when the
// Go process dies, so that no broker outlives the process that started it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
