//go:build !linux

package procs

import (
	"errors"
	"os/exec"
	"time"
)

// setParentDeathSignal has no portable equivalent outside Linux: there the
// suite's own shutdown (context cancellation) is what stops its children.
func setParentDeathSignal(*exec.Cmd) {}

// cpuTime is not measured outside Linux.
func cpuTime(int) (time.Duration, error) {
	return 0, errors.New("per-process CPU time is read from /proc, which this system lacks")
}
