package main

import (
	"google.golang.org/grpc/experimental"

	"github.com/sluice-gw/sluice/runner"
)

// The binary's gRPC buffer pool is runner.GRPCBufferPool (a tier at every power of two up to 4 MiB, where gRPC's
// default tiers jump from 32 KiB to 1 MiB). The pool is process-wide: gRPC's protobuf codec, which encodes and
// decodes every ext_proc message, reads no other, and gRPC allows setting it only before any gRPC use.
func init() {
	experimental.SetDefaultBufferPool(runner.GRPCBufferPool())
}
