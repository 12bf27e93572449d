//go:build unix

package plugins

import (
	"syscall"
	"testing"
	"time"
)

// cpuPerOp starts measuring the process's CPU time (user + system, all threads); the function it returns, called when
// b's loop ends, reports it per operation as cpu-ns/op: on a shared machine wall time mixes the work with waiting
// for a CPU (runnertest.CPUPerOp, which this package's tests cannot import).
func cpuPerOp(b *testing.B) (stop func()) {
	start := processCPU()
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
