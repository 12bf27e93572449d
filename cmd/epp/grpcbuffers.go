package main

import (
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"

	"github.com/sluice-gw/sluice/runner"
)

// newBufferPool is the binary's gRPC buffer pool (runner.GRPCBufferPool: a tier at every power of two up to 4 MiB,
// where gRPC's default tiers jump from 32 KiB to 1 MiB).
func newBufferPool() mem.BufferPool { return runner.GRPCBufferPool() }

// The pool is process-wide: gRPC's protobuf codec, which encodes and decodes every ext_proc message, reads no
// other, and gRPC allows setting it only before any gRPC use.
func init() {
	experimental.SetDefaultBufferPool(newBufferPool())
}
