//go:build !unix

package plugins

import "testing"

// cpuPerOp reports nothing where the process's CPU time is not read.
func cpuPerOp(*testing.B) (stop func()) { return func() {} }
