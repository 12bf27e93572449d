//go:build !linux

package benchsuite

import "os/exec"

// setParentDeathSignal has no portable equivalent outside Linux: there the
// suite's own shutdown (context cancellation) is what stops its children.
func setParentDeathSignal(*exec.Cmd) {}
