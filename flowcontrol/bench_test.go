package flowcontrol

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	clocktesting "k8s.io/utils/clock/testing"
)

// BenchmarkAdmitFastPath measures the admission fast path (headroom available, nothing waiting) over a pool of 16
// endpoints: one Admit and the Release that ends the request. Target: well under 5 µs and at most one allocation
// (the list of endpoints with headroom handed to the scheduler).
func BenchmarkAdmitFastPath(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Endpoint.QueueDepth = 1 << 30 // never saturate: every call takes the fast path
	clk := clocktesting.NewFakeClock(t0)
	c, err := New(cfg, Deps{Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	eps := make([]Endpoint, 16)
	for i := range eps {
		eps[i] = Endpoint{Name: fmt.Sprintf("pod-%02d", i), WaitingQueue: i, KVCacheUsage: 0.3, ScrapedAt: t0}
	}
	if err := c.UpdateEndpoints(eps); err != nil {
		b.Fatal(err)
	}
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("req-%d", i)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		id := ids[i%len(ids)]
		d, err := c.Admit(ctx, Request{ID: id, Tenant: "tenant", Priority: 0, Bytes: 512, EstimatedCost: 300})
		if err != nil || d.Outcome != Dispatched {
			b.Fatalf("fast path not taken: %+v %v", d, err)
		}
		c.Release(id)
	}
}

// BenchmarkAdmitFastPathParallel is the fast path under contention from all Ps.
func BenchmarkAdmitFastPathParallel(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Endpoint.QueueDepth = 1 << 30
	clk := clocktesting.NewFakeClock(t0)
	c, err := New(cfg, Deps{Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	eps := make([]Endpoint, 16)
	for i := range eps {
		eps[i] = Endpoint{Name: fmt.Sprintf("pod-%02d", i), ScrapedAt: t0}
	}
	if err := c.UpdateEndpoints(eps); err != nil {
		b.Fatal(err)
	}
	var worker atomicCounter
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := worker.next()
		ids := make([]string, 256)
		for i := range ids {
			ids[i] = fmt.Sprintf("w%d-req-%d", w, i)
		}
		ctx := context.Background()
		for i := 0; pb.Next(); i++ {
			id := ids[i%len(ids)]
			if _, err := c.Admit(ctx, Request{ID: id, Tenant: "tenant", EstimatedCost: 300}); err != nil {
				b.Fatal(err)
			}
			c.Release(id)
		}
	})
}

// BenchmarkEnqueueDispatch10kQueued1kTenants measures the queued path of the controller at depth: with 10k requests
// waiting over 1k tenants and one endpoint at its threshold, each iteration enqueues one request and releases one
// slot, which dispatches the fair head of the band (strict priority, SFQ, reservation bookkeeping, TTL timer).
// Callers' goroutines are left out: this is the controller's own cost.
func BenchmarkEnqueueDispatch10kQueued1kTenants(b *testing.B) {
	cfg := DefaultConfig()
	cfg.MaxQueuedRequests = 1 << 20
	for _, band := range allBands {
		cfg.Bands[band].MaxQueuedRequests = 1 << 20
	}
	clk := clocktesting.NewFakeClock(t0)
	c, err := New(cfg, Deps{Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.UpdateEndpoints([]Endpoint{{Name: "pod", WaitingQueue: cfg.Endpoint.QueueDepth - 1, ScrapedAt: t0}}); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const queued, tenants = 10000, 1000
	reqs := make([]Request, queued+1+b.N)
	for i := range reqs {
		reqs[i] = Request{ID: fmt.Sprintf("req-%d", i), Tenant: fmt.Sprintf("tenant-%d", rng.IntN(tenants)),
			Priority: rng.IntN(2), Bytes: 1024, EstimatedCost: uint64(1 + rng.IntN(4000))}
	}
	enqueue := func(req Request) {
		c.mu.Lock()
		now := c.clock.Now()
		_, _, changed, _ := c.admitLocked(req, now)
		if changed {
			c.endOpLocked(now)
		}
		c.mu.Unlock()
	}
	enqueue(reqs[0]) // takes the last slot
	for _, req := range reqs[1 : queued+1] {
		enqueue(req)
	}
	if s := c.Stats(); s.Queued[Critical]+s.Queued[Standard] != queued {
		b.Fatalf("queued %v, want %d", s.Queued, queued)
	}
	held := reqs[0].ID
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		enqueue(reqs[queued+1+i])
		c.Release(held)
		c.mu.Lock()
		for id := range c.reservations {
			held = id
		}
		c.mu.Unlock()
	}
}

type atomicCounter struct{ n atomic.Int64 }

func (a *atomicCounter) next() int64 { return a.n.Add(1) }
