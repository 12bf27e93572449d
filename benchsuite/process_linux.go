package benchsuite

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal asks the kernel to send the child SIGTERM when the
// thread that started it exits, so a killed suite leaves no fleet behind.
// Go keeps that thread alive for the life of the process unless it is
// locked and its goroutine exits, which the suite never does.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
