package plugins

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/contracts/mocks"
	fccontroller "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/controller"
	fcregistry "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/registry"
	fcupstreamtypes "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkfc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/flowcontrol"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/fairness"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/ordering"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/usagelimits"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"

	"github.com/sluice-gw/sluice/flowcontrol"
)

// Benchmarks put Sluice's adapter and controller side by side with upstream v1.5.0 on the same workload, in one run:
//
//	go test ./plugins/ -run '^$' -bench 'BenchmarkAdmission|BenchmarkEnqueueDispatch10k' -benchmem
//
// Results are compared as ratios; no benchmark asserts a time.

const benchPoolSize = 16

// benchPool returns benchPoolSize idle upstream endpoints with fresh metrics.
func benchPool(now time.Time) []fwkdl.Endpoint {
	eps := make([]fwkdl.Endpoint, benchPoolSize)
	for i := range eps {
		eps[i] = upstreamEndpoint(fmt.Sprintf("10.0.0.%d", i+1), i%3, 0.3, now)
	}
	return eps
}

// BenchmarkAdmission measures admission of a Sheddable request on a pool with headroom: the fast path.
//
//   - sluice: the adapter's Admit (controller fast path, decision kept for the headroom filter, which the Sluice
//     default profile includes), then the lifecycle hooks that end the request (PreRequest's Bind and the final
//     ResponseBody's Release), so the pool stays in the same state from one op to the next.
//   - upstream: LegacyAdmissionController.Admit with upstream's default saturation detector (utilization) over the
//     same endpoints; it has no per-request state to release.
func BenchmarkAdmission(b *testing.B) {
	log.SetLogger(logr.Discard())
	ctx := context.Background()
	now := time.Now()
	// Scraped an hour ahead: upstream's detector reads the real clock and would find the metrics stale mid-run.
	pool := benchPool(now.Add(time.Hour))
	ids := make([]string, 1024)
	reqs := make([]*fwksched.LLMRequest, len(ids))
	rcs := make([]*handlers.RequestContext, len(ids))
	for i := range ids {
		ids[i] = fmt.Sprintf("req-%d", i)
		rcs[i] = requestContext(ids[i], "tenant", 2048, fwksched.PayloadMap{"max_tokens": float64(128)})
		reqs[i] = rcs[i].SchedulingRequest
	}

	b.Run("sluice", func(b *testing.B) {
		clk := clocktesting.NewFakeClock(now)
		fc, err := NewFlowControl(nil, FlowControlOptions{}, FlowControlDeps{Endpoints: &fakePool{eps: pool}, Clock: clk})
		if err != nil {
			b.Fatal(err)
		}
		if err := fc.SyncEndpoints(); err != nil {
			b.Fatal(err)
		}
		fc.Attach(map[string]fwkplugin.Plugin{HeadroomFilterType: mustHeadroomFilter(b)})
		target := fwksched.NewEndpoint(pool[0].GetMetadata(), pool[0].GetMetrics(), nil)
		result := &fwksched.SchedulingResult{PrimaryProfileName: "default",
			ProfileResults: map[string]*fwksched.ProfileRunResult{"default": {TargetEndpoints: []fwksched.Endpoint{target}}}}
		end := &fwkrc.Response{EndOfStream: true}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			k := i % len(ids)
			if err := fc.Admit(ctx, rcs[k], -1); err != nil {
				b.Fatal(err)
			}
			fc.PreRequest(ctx, reqs[k], result)
			fc.ResponseBody(ctx, reqs[k], end, nil)
		}
	})

	b.Run("upstream", func(b *testing.B) {
		sd, err := utilization.UtilizationDetectorFactory(utilization.UtilizationDetectorType, nil, fwkplugin.NewEppHandle(ctx, nil))
		if err != nil {
			b.Fatal(err)
		}
		lac := requestcontrol.NewLegacyAdmissionController(sd.(fwkfc.SaturationDetector), &mocks.MockEndpointCandidates{Candidates: pool})
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if err := lac.Admit(ctx, rcs[i%len(ids)], -1); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkEnqueueDispatch10k measures queued admission at depth: 10k requests wait over 1k tenants in two bands
// while the pool has room for exactly one request. Each op frees the slot, submits one more request and waits for
// the dispatch that follows, so the queue stays 10k deep and every op is one enqueue plus one fair dispatch, with the
// blocked callers' goroutines included on both sides.
//
//   - sluice: flowcontrol.Controller, one endpoint one reservation short of its threshold; Release frees the slot.
//   - upstream: v1.5.0's FlowController (one shard, round-robin fairness across flows, FCFS within a flow) with a
//     saturation detector that admits exactly one in-flight request; freeing the slot is the dispatched request's
//     completion.
func BenchmarkEnqueueDispatch10k(b *testing.B) {
	log.SetLogger(logr.Discard())
	const queued, tenants = 10000, 1000

	b.Run("sluice", func(b *testing.B) {
		cfg := flowcontrol.DefaultConfig()
		cfg.MaxQueuedRequests = 1 << 20
		for _, band := range flowcontrol.AllBands() {
			cfg.Bands[band].MaxQueuedRequests = 1 << 20
			cfg.Bands[band].MaxQueueTime = time.Hour
		}
		clk := clocktesting.NewFakeClock(time.Now())
		c, err := flowcontrol.New(cfg, flowcontrol.Deps{Clock: clk})
		if err != nil {
			b.Fatal(err)
		}
		if err := c.UpdateEndpoints([]flowcontrol.Endpoint{{Name: "pod", WaitingQueue: cfg.Endpoint.QueueDepth - 1, ScrapedAt: clk.Now()}}); err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		req := func(i int) flowcontrol.Request {
			return flowcontrol.Request{ID: fmt.Sprintf("req-%d", i), Tenant: fmt.Sprintf("tenant-%d", rng.IntN(tenants)),
				Priority: rng.IntN(2), Bytes: 1024, EstimatedCost: uint64(1 + rng.IntN(4000))}
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		dispatched := make(chan string, 16)
		submit := func(r flowcontrol.Request) {
			go func() {
				if _, err := c.Admit(ctx, r); err == nil {
					dispatched <- r.ID
				}
			}()
		}
		first := req(0)
		if _, err := c.Admit(ctx, first); err != nil {
			b.Fatal(err)
		}
		held := first.ID
		for i := 1; i <= queued; i++ {
			submit(req(i))
		}
		for s := c.Stats(); s.Queued[flowcontrol.Critical]+s.Queued[flowcontrol.Standard] < queued; s = c.Stats() {
			runtime.Gosched() // setup only: let the submitted callers enqueue
		}
		next := make([]flowcontrol.Request, b.N)
		for i := range next {
			next[i] = req(queued + 1 + i)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			c.Release(held)
			submit(next[i])
			held = <-dispatched
		}
		b.StopTimer()
	})

	b.Run("upstream", func(b *testing.B) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		handle := fwkplugin.NewEppHandle(ctx, nil)
		rr, err := fairness.RoundRobinFairnessPolicyFactory(fairness.RoundRobinFairnessPolicyType, nil, handle)
		if err != nil {
			b.Fatal(err)
		}
		handle.AddPlugin(fairness.RoundRobinFairnessPolicyType, rr)
		fcfs, err := ordering.FCFSOrderingPolicyFactory(ordering.FCFSOrderingPolicyType, nil, handle)
		if err != nil {
			b.Fatal(err)
		}
		handle.AddPlugin(ordering.FCFSOrderingPolicyType, fcfs)
		strict, err := fairness.GlobalStrictFairnessPolicyFactory(fcregistry.DefaultFairnessPolicyRef, nil, handle)
		if err != nil {
			b.Fatal(err)
		}
		handle.AddPlugin(fcregistry.DefaultFairnessPolicyRef, strict) // the registry's default band needs it
		opts := []fcregistry.ConfigOption{fcregistry.WithInitialShardCount(1), fcregistry.WithMaxBytes(0)}
		for p := range 2 {
			band, err := fcregistry.NewPriorityBandConfig(handle, p,
				fcregistry.WithFairnessPolicy(fairness.RoundRobinFairnessPolicyType, handle),
				fcregistry.WithOrderingPolicy(ordering.FCFSOrderingPolicyType, handle),
				fcregistry.WithBandMaxBytes(1<<40))
			if err != nil {
				b.Fatal(err)
			}
			opts = append(opts, fcregistry.WithPriorityBand(band))
		}
		regCfg, err := fcregistry.NewConfig(handle, opts...)
		if err != nil {
			b.Fatal(err)
		}
		reg, err := fcregistry.NewFlowRegistry(regCfg, logr.Discard())
		if err != nil {
			b.Fatal(err)
		}
		go reg.Run(ctx)
		detector := &oneSlotDetector{}
		fc, err := fccontroller.NewFlowController(ctx, "bench", &fccontroller.Config{
			DefaultRequestTTL:               time.Hour,
			ExpiryCleanupInterval:           time.Hour,
			ProcessorReconciliationInterval: time.Hour,
			EnqueueChannelBufferSize:        100,
		}, fccontroller.Deps{
			Registry:           reg,
			SaturationDetector: detector,
			EndpointCandidates: &mocks.MockEndpointCandidates{},
			UsageLimitPolicy:   usagelimits.DefaultPolicy(),
		})
		if err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		req := func(i int) *benchFlowRequest {
			return &benchFlowRequest{id: fmt.Sprintf("req-%d", i), received: time.Now(),
				key: fwkfc.FlowKey{ID: fmt.Sprintf("tenant-%d", rng.IntN(tenants)), Priority: rng.IntN(2)}}
		}
		dispatched := make(chan struct{}, 16)
		var waiting atomic.Int64
		submit := func(r *benchFlowRequest) {
			waiting.Add(1)
			go func() {
				outcome, _ := fc.EnqueueAndWait(ctx, r)
				waiting.Add(-1)
				if outcome == fcupstreamtypes.QueueOutcomeDispatched {
					dispatched <- struct{}{}
				}
			}()
		}
		submit(req(0))
		<-dispatched // holds the one slot
		for i := 1; i <= queued; i++ {
			submit(req(i))
		}
		for reg.Stats().TotalLen < queued {
			runtime.Gosched() // setup only: let the submitted callers enqueue
		}
		next := make([]*benchFlowRequest, b.N)
		for i := range next {
			next[i] = req(queued + 1 + i)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			detector.release()
			submit(next[i])
			<-dispatched
		}
		b.StopTimer()
		if w := waiting.Load(); w < queued {
			b.Fatalf("only %d requests waited; the queue was not kept at depth", w)
		}
	})
}

// oneSlotDetector is a saturation detector for a pool with room for one in-flight request: evaluating saturation
// claims the slot when it is free.
type oneSlotDetector struct {
	fwkfc.SaturationDetector // only Saturation is called
	inFlight                 atomic.Int64
}

func (d *oneSlotDetector) Saturation(context.Context, []fwkdl.Endpoint) float64 {
	if d.inFlight.CompareAndSwap(0, 1) {
		return 0
	}
	return 1
}

func (d *oneSlotDetector) release() { d.inFlight.Store(0) }

// benchFlowRequest is the upstream controller's view of one request.
type benchFlowRequest struct {
	id       string
	key      fwkfc.FlowKey
	received time.Time
}

func (r *benchFlowRequest) FlowKey() fwkfc.FlowKey                 { return r.key }
func (r *benchFlowRequest) ByteSize() uint64                       { return 1024 }
func (r *benchFlowRequest) InferenceRequest() *fwksched.LLMRequest { return nil }
func (r *benchFlowRequest) ReceivedTimestamp() time.Time           { return r.received }
func (r *benchFlowRequest) InitialEffectiveTTL() time.Duration     { return time.Hour }
func (r *benchFlowRequest) ID() string                             { return r.id }
func (r *benchFlowRequest) GetMetadata() map[string]any            { return nil }
func (r *benchFlowRequest) InferencePoolName() string              { return "bench" }
func (r *benchFlowRequest) ModelName() string                      { return "bench" }
func (r *benchFlowRequest) TargetModelName() string                { return "bench" }
