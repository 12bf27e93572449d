//go:build !unix

package virtualbench

import "time"

// processCPU is not measured on this system: EPPCost's CPU figures stay zero.
func processCPU() time.Duration { return 0 }
