//go:build !unix

package runnertest

import "testing"

// CPUPerOp reports nothing on this system: its CPU time is not measured here.
func CPUPerOp(*testing.B) (stop func()) { return func() {} }
