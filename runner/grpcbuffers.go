package runner

import (
	"fmt"

	"google.golang.org/grpc/mem"
)

// gRPC takes the buffer of every message it sends or receives from a pool of power-of-two tiers, zeroed on each use;
// its default tiers jump from 32 KiB to 1 MiB. A long prompt crosses the EPP in messages just above 32 KiB (the
// proxy's body chunks with their framing) and just under 64 KiB (the body chunks upstream's handler sends back), so
// each of them took, and zeroed, a 1 MiB buffer, a fresh one after every GC (the pool is a sync.Pool), which the
// runtime then returned to the OS. With a tier at every power of two up to 4 MiB, such a message takes a buffer at
// most twice its size.

// grpcBufferTiers are the exponents of the pool's tiers: 256 B, 4 KiB, then every power of two from 16 KiB
// (gRPC's HTTP/2 frame) to 4 MiB. Larger messages take gRPC's fallback, a buffer of their own size.
var grpcBufferTiers = []uint8{8, 12, 14, 15, 16, 17, 18, 19, 20, 21, 22}

// GRPCBufferPool is gRPC's tiered pool, zeroing as gRPC's default does, with grpcBufferTiers: the process-wide pool
// the EPP binary sets (cmd/epp, experimental.SetDefaultBufferPool), and the in-process benchmarks with it.
func GRPCBufferPool() mem.BufferPool {
	pool, err := mem.NewBinaryTieredBufferPool(grpcBufferTiers...)
	if err != nil {
		panic(fmt.Sprintf("gRPC buffer pool: %v", err)) // the tiers are constants
	}
	return pool
}
