//go:build unix

package virtualbench

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user + system) the process has used, all threads together: the EPP's own work and
// the garbage collection it causes, which wall time on a shared machine mixes with waiting for a CPU.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
