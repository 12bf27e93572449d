package main

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/mem"

	"github.com/sluice-gw/sluice/runner"
)

// TestGRPCBuffersFitLongPromptMessages checks that the binary's gRPC pool (set in init) hands the messages a long
// prompt crosses the EPP in a buffer at most twice their size: with gRPC's default tiers each took 1 MiB.
func TestGRPCBuffersFitLongPromptMessages(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
	}{
		{"a 32 KiB request body chunk with its framing", 32<<10 + 40},
		{"a 62,500-byte request body answer with its framing", 62500 + 20},
		{"a 16 KiB frame", 16 << 10},
		{"a 300 KiB message", 300 << 10},
		{"a 3 MiB message", 3 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf := mem.DefaultBufferPool().Get(tc.size)
			defer mem.DefaultBufferPool().Put(buf)
			if len(*buf) != tc.size || cap(*buf) > 2*tc.size {
				t.Errorf("Get(%d): len %d, cap %d; want len %d, cap at most %d", tc.size, len(*buf), cap(*buf), tc.size, 2*tc.size)
			}
		})
	}
}

// BenchmarkGRPCBufferPool is one long-prompt message's buffer, taken and given back as gRPC does, from gRPC's default
// tiers and from the binary's.
//
//	go test -run '^$' -bench GRPCBufferPool -benchmem ./cmd/epp/
func BenchmarkGRPCBufferPool(b *testing.B) {
	grpcDefault, err := mem.NewBinaryTieredBufferPool(8, 12, 14, 15, 20) // grpc v1.80.0 mem.defaultBufferPoolSizeExponents
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range []int{32<<10 + 40, 62500 + 20} {
		for _, p := range []struct {
			name string
			pool mem.BufferPool
		}{{"grpc-default", grpcDefault}, {"epp", runner.GRPCBufferPool()}} {
			b.Run(fmt.Sprintf("size=%d/pool=%s", size, p.name), func(b *testing.B) {
				for b.Loop() {
					p.pool.Put(p.pool.Get(size))
				}
			})
		}
	}
}
