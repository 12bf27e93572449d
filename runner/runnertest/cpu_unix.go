//go:build unix

package runnertest

import (
	"syscall"
	"testing"
	"time"
)

// CPUPerOp starts measuring the CPU time (user + system, all threads) the process uses; the function it returns,
// called when b's loop ends, reports it per operation as the metric cpu-ns/op. On a shared machine a benchmark's
// wall time mixes its work with waiting for a CPU; its CPU time is its work (and the garbage collection it causes),
// so side-by-side comparisons of CPU time stay meaningful under load. Anything else the process runs meanwhile
// (an EPP's metric scrapes) counts too, alike for every contender.
func CPUPerOp(b *testing.B) (stop func()) {
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
