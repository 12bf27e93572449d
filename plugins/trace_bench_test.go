package plugins

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"

	"github.com/sluice-gw/sluice/plugins/decisiontrace"
)

// BenchmarkDecisionTrace prices the decision trace on one request's decision path: Sluice admission, then Sluice's
// default profile (loaded by upstream's loader, run by upstream's scheduler) over benchPoolSize endpoints, then the
// hooks that end the request, so the pool is in the same state from one op to the next:
//
//   - off: the EPP without --decision-trace: upstream's scheduler configuration, no trace in the context.
//   - on-not-selected: --decision-trace with --decision-trace-header, for a request without the header (what every
//     request the trace does not select pays): the traced configuration, an inactive trace in the context.
//   - on-traced: a traced request, its record committed to the ring (the -v=3 log line is not written).
//
// Compare the variants as ratios, in one run (testbed/bench/scenarios/README.md, Micro-benchmarks):
//
//	go test ./plugins/ -run '^$' -bench 'BenchmarkDecisionTrace' -benchmem -benchtime 3000x -count 8
func BenchmarkDecisionTrace(b *testing.B) {
	log.SetLogger(logr.Discard())
	servers := make([]modelServer, benchPoolSize)
	for i := range servers {
		servers[i] = modelServer{fmt.Sprintf("10.0.0.%d", i+1), "base", i % 3}
	}
	p := newDefaultProfilePool(b, servers)
	traced, err := TracedSchedulerConfig(p.raw.SchedulingProfiles, p.plugins)
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, 1024)
	rcs := make([]*handlers.RequestContext, len(ids))
	for i := range ids {
		ids[i] = fmt.Sprintf("req-%d", i)
		rcs[i] = requestContext(ids[i], "tenant", 100, nil)
		rcs[i].TargetModelName = "base"
		rcs[i].SchedulingRequest.TargetModel = "base"
		rcs[i].SchedulingRequest.Body.Completions = &fwksched.CompletionsRequest{Prompt: fwksched.Prompt{Raw: "hello " + ids[i]}}
	}
	end := &fwkrc.Response{EndOfStream: true}
	// decide runs request k's decision path with ctx and scheduler, and returns where it went.
	decide := func(b *testing.B, ctx context.Context, scheduler *scheduling.Scheduler, k int) string {
		if err := p.fc.Admit(ctx, rcs[k], 0); err != nil {
			b.Fatal(err)
		}
		req := rcs[k].SchedulingRequest
		result, err := scheduler.Schedule(ctx, req, p.candidates)
		if err != nil {
			b.Fatal(err)
		}
		p.fc.PreRequest(ctx, req, result)
		p.fc.ResponseBody(ctx, req, end, nil)
		return EndpointName(result.ProfileResults[result.PrimaryProfileName].TargetEndpoints[0].GetMetadata())
	}
	newRecorder := func(b *testing.B, header string) *decisiontrace.Recorder {
		rec, err := decisiontrace.New(decisiontrace.Config{Size: 200, Header: header})
		if err != nil {
			b.Fatal(err)
		}
		return rec
	}

	// Warm up: the request-ID maps and the prefix index reach their steady size before any variant is timed.
	for k := range 2 * len(ids) {
		decide(b, context.Background(), p.scheduler, k%len(ids))
	}

	b.Run("off", func(b *testing.B) {
		ctx := context.Background()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			decide(b, ctx, p.scheduler, i%len(ids))
		}
	})
	b.Run("on-not-selected", func(b *testing.B) {
		scheduler := scheduling.NewSchedulerWithConfig(traced)
		rec := newRecorder(b, "x-sluice-trace")
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			ctx, tr := rec.Start(context.Background())
			tr.Begin(ids[i%len(ids)], false)
			tr.Routed(decide(b, ctx, scheduler, i%len(ids)))
		}
		if n := len(rec.Records("", 0)); n != 0 {
			b.Fatalf("%d requests recorded, want none", n)
		}
	})
	b.Run("on-traced", func(b *testing.B) {
		scheduler := scheduling.NewSchedulerWithConfig(traced)
		rec := newRecorder(b, "")
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			ctx, tr := rec.Start(context.Background())
			tr.Begin(ids[i%len(ids)], false)
			tr.Routed(decide(b, ctx, scheduler, i%len(ids)))
		}
		if recs := rec.Records("", 1); len(recs) != 1 || len(recs[0].Profiles) != 1 || recs[0].Endpoint == "" {
			b.Fatalf("records %+v, want every request's", recs)
		}
	})
}
