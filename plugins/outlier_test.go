package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/flowcontrol/replication"
	"github.com/sluice-gw/sluice/lora"
	"github.com/sluice-gw/sluice/outlier"
)

func TestOutlierFilterFactory(t *testing.T) {
	tests := []struct {
		name, params string
		want         outlier.Config
		err          string
	}{
		{name: "defaults", params: "", want: outlier.DefaultConfig()},
		{name: "all set", params: `{"consecutive5xx": 3, "localConsecutive5xx": 0, "baseEjectionTime": "2s", "maxEjectionTime": "1m", "maxEjectionPercent": 34, "slowFactor": 6.5, "slowGaps": 2, "ejectOnStall": false}`,
			want: outlier.Config{Consecutive5xx: 3, BaseEjectionTime: 2 * time.Second, MaxEjectionTime: time.Minute, MaxEjectionPercent: 34, SlowFactor: 6.5, SlowGaps: 2}},
		{name: "slow detection off", params: `{"slowFactor": 0}`, want: func() outlier.Config { c := outlier.DefaultConfig(); c.SlowFactor = 0; return c }()},
		{name: "stall rule off", params: `{"ejectOnStall": false}`, want: func() outlier.Config { c := outlier.DefaultConfig(); c.EjectOnStall = false; return c }()},
		{name: "slow factor below 1", params: `{"slowFactor": 0.5}`, err: "slowFactor must be 0 (off) or at least 1, got 0.5"},
		{name: "no slow gaps", params: `{"slowGaps": 0}`, err: "slowGaps must be within 1-32, got 0"},
		{name: "local rule above the full count", params: `{"consecutive5xx": 3, "localConsecutive5xx": 4}`, err: "localConsecutive5xx must be within 0 (off) and consecutive5xx (3), got 4"},
		{name: "unknown field", params: `{"consecutive5xxx": 3}`, err: "unknown field"},
		{name: "invalid values", params: `{"consecutive5xx": 0, "maxEjectionPercent": 200}`, err: "consecutive5xx must be at least 1"},
		{name: "max below base", params: `{"baseEjectionTime": "10s", "maxEjectionTime": "5s"}`, err: "maxEjectionTime (5s) must be at least baseEjectionTime (10s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var api outlierAPIConfig
			if err := decodeParams(json.RawMessage(tt.params), &api); err == nil && tt.err == "" && api.config() != tt.want {
				t.Errorf("config %+v, want %+v", api.config(), tt.want)
			}
			p, err := OutlierFilterFactory("f", json.RawMessage(tt.params), nil)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := p.TypedName(); got.Type != OutlierFilterType || got.Name != "f" {
				t.Errorf("typed name %+v", got)
			}
		})
	}
}

// respond reports to f a response of status from endpoint ep, as upstream's director does when the response headers
// arrive (Envoy sends the status as ":status").
func respond(f *OutlierFilter, ep fwksched.Endpoint, status string) {
	headers := map[string]string{"content-type": "application/json"}
	if status != "" {
		headers[":status"] = status
	}
	f.ResponseHeader(context.Background(), &fwksched.LLMRequest{RequestId: "r"}, &fwkrc.Response{RequestId: "r", Headers: headers}, ep.GetMetadata())
}

// newOutlierFilter returns an OutlierFilter with params on clk, and three endpoints.
func newOutlierFilter(t *testing.T, params string, clk clock.PassiveClock) (*OutlierFilter, []fwksched.Endpoint) {
	t.Helper()
	p, err := OutlierFilterFactory("", json.RawMessage(params), clockHandle{clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	var eps []fwksched.Endpoint
	for i := range 3 {
		ep := upstreamEndpoint(fmt.Sprintf("10.0.0.%d", i+1), 0, 0, fcT0)
		eps = append(eps, fwksched.NewEndpoint(ep.GetMetadata(), ep.GetMetrics(), fwkdl.NewAttributes()))
	}
	return p.(*OutlierFilter), eps
}

func TestOutlierFilter(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(fcT0)
	f, eps := newOutlierFilter(t, `{"consecutive5xx": 2, "baseEjectionTime": "1s"}`, clk)
	names := func(kept []fwksched.Endpoint) []string {
		var out []string
		for _, ep := range kept {
			out = append(out, EndpointName(ep.GetMetadata()))
		}
		return out
	}
	all := names(eps)
	steps := []struct {
		name      string
		do        func()
		candidate []fwksched.Endpoint
		want      []string
	}{
		{"no response yet", func() {}, eps, all},
		{"one 500", func() { respond(f, eps[0], "500") }, eps, all},
		{"no status and a bad one do not count", func() { respond(f, eps[0], ""); respond(f, eps[0], "x") }, eps, all},
		{"a second 500 ejects", func() { respond(f, eps[0], "503") }, eps, all[1:]},
		{"never the only candidate", func() {}, eps[:1], all[:1]},
		{"a pick of two loses it", func() {}, eps[:2], all[1:2]},
		{"back after the base ejection time", func() { clk.SetTime(fcT0.Add(time.Second)) }, eps, all},
		{"one more 500 ejects it again", func() { respond(f, eps[0], "500") }, eps, all[1:]},
		{"twice as long", func() { clk.SetTime(fcT0.Add(2999 * time.Millisecond)) }, eps, all[1:]},
		{"back", func() { clk.SetTime(fcT0.Add(3 * time.Second)) }, eps, all},
		{"a success clears it", func() { respond(f, eps[0], "200"); respond(f, eps[0], "500") }, eps, all},
	}
	for _, s := range steps {
		s.do()
		if got := names(f.Filter(t.Context(), fwksched.NewCycleState(), nil, s.candidate)); !slices.Equal(got, s.want) {
			t.Errorf("%s: kept %v, want %v", s.name, got, s.want)
		}
	}
}

// TestDefaultProfileLeavesAFailingServer: in Sluice's default profile, a server that answers 500s, idle and so
// everyone's favourite, gets no request once it failed consecutive5xx times in a row.
func TestDefaultProfileLeavesAFailingServer(t *testing.T) {
	p := newDefaultProfilePool(t, []modelServer{{"10.0.0.1", "base", 0}, {"10.0.0.2", "base", 40}, {"10.0.0.3", "base", 40}})
	f, ok := p.plugins[OutlierFilterType].(*OutlierFilter)
	if !ok {
		t.Fatalf("the default profile has no %s", OutlierFilterType)
	}
	f.clock = clocktesting.NewFakePassiveClock(fcT0) // its ejections last until the test moves this clock
	failing := p.candidates[0]
	for i := range outlier.DefaultConsecutive5xx {
		got, err := p.route(t.Context(), t, p.scheduler, fmt.Sprintf("req-%d", i), "base")
		if err != nil {
			t.Fatal(err)
		}
		if got != "10.0.0.1:8000" {
			t.Fatalf("request %d went to %s before the idle server failed %d times", i, got, outlier.DefaultConsecutive5xx)
		}
		respond(f, failing, "500")
	}
	for i := range 5 {
		got, err := p.route(t.Context(), t, p.scheduler, fmt.Sprintf("after-%d", i), "base")
		if err != nil {
			t.Fatal(err)
		}
		if got == "10.0.0.1:8000" {
			t.Fatalf("request %d after the ejection went to the failing server", i)
		}
	}
}

// TestFlowControlCountsNoHeadroomOnEjected: once the outlier filter attached to Sluice admission ejects an endpoint,
// the next snapshot marks it ejected, so admission counts no headroom there (ranked +Inf); when the ejection ends, the
// endpoint counts again.
func TestFlowControlCountsNoHeadroomOnEjected(t *testing.T) {
	pool := &fakePool{}
	pool.set(upstreamEndpoint("10.0.0.1", 0, 0, fcT0), upstreamEndpoint("10.0.0.2", 0, 0, fcT0))
	fc, clk := newTestFlowControl(t, nil, pool)
	p, err := OutlierFilterFactory("", nil, clockHandle{clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	f := p.(*OutlierFilter)
	fc.Attach(map[string]fwkplugin.Plugin{"outlier": f})
	names := []string{"10.0.0.1:8000", "10.0.0.2:8000"}
	ranks := func() []float64 {
		t.Helper()
		pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()), upstreamEndpoint("10.0.0.2", 0, 0, clk.Now()))
		if err := fc.SyncEndpoints(); err != nil {
			t.Fatal(err)
		}
		out := make([]float64, len(names))
		fc.Controller().Saturations("", names, out)
		return out
	}
	if r := ranks(); math.IsInf(r[0], 1) || math.IsInf(r[1], 1) {
		t.Fatalf("before any failure: %v, want both finite", r)
	}
	var eps []fwksched.Endpoint
	for _, ep := range pool.PodList(allEndpoints) {
		eps = append(eps, fwksched.NewEndpoint(ep.GetMetadata(), ep.GetMetrics(), fwkdl.NewAttributes()))
	}
	respond(f, eps[0], "500")
	respond(f, eps[1], "200")
	respond(f, eps[0], "500") // the local rule: ejected
	if r := ranks(); !math.IsInf(r[0], 1) || math.IsInf(r[1], 1) {
		t.Fatalf("with 10.0.0.1 ejected: %v, want [+Inf, finite]", r)
	}
	clk.Step(outlier.DefaultBaseEjectionTime)
	if r := ranks(); math.IsInf(r[0], 1) {
		t.Fatalf("after the ejection: %v, want 10.0.0.1 finite", r)
	}
}

// chunk reports to f a chunk of request id's streamed response from ep (the last one when end), as upstream's
// director does for every chunk.
func chunk(f *OutlierFilter, ep fwksched.Endpoint, id string, end bool) {
	f.ResponseBody(context.Background(), &fwksched.LLMRequest{RequestId: id}, &fwkrc.Response{RequestId: id, EndOfStream: end}, ep.GetMetadata())
}

// streamSteps returns a function that moves clk on by n steps of 20 ms and, at each, reports a chunk of a stream
// from each of the servers (indexes into eps), and, when whole, a non-streamed answer from each too (one call, at
// its end, which times nothing).
func streamSteps(clk *clocktesting.FakeClock, f *OutlierFilter, eps []fwksched.Endpoint, whole bool) func(n int, servers ...int) {
	return func(n int, servers ...int) {
		for range n {
			clk.Step(20 * time.Millisecond)
			for _, i := range servers {
				chunk(f, eps[i], fmt.Sprint("warm-", i), false)
				if whole {
					chunk(f, eps[i], "whole", true)
				}
			}
		}
	}
}

// TestOutlierFilterPace: streamed responses time their endpoint's pace; a server whose streams all stall, with no
// long prompt sent to it that its prefill would explain, is left out once the silence is 4x its usual gap; a long
// prompt dispatched to it (PreRequest) explains its silence until the prompt's first chunk; a non-streamed response
// (one call, at its end) times nothing.
func TestOutlierFilterPace(t *testing.T) {
	clk := clocktesting.NewFakeClock(fcT0)
	f, eps := newOutlierFilter(t, "", clk)
	kept := func() int { return len(f.Filter(t.Context(), fwksched.NewCycleState(), nil, eps)) }
	// Every server streams at 20 ms a chunk; non-streamed answers come and go.
	step := streamSteps(clk, f, eps, true)
	step(100, 0, 1, 2)
	if n := kept(); n != 3 {
		t.Fatalf("at a steady pace: %d kept, want 3", n)
	}
	// A long prompt (2 KB, about 512 tokens: a prefill of up to 8 usual gaps) sent to server 0 stalls its streams
	// for 200 ms.
	f.PreRequest(t.Context(), &fwksched.LLMRequest{RequestId: "long", RequestSizeBytes: 2 << 10}, &fwksched.SchedulingResult{
		PrimaryProfileName: "default", ProfileResults: map[string]*fwksched.ProfileRunResult{"default": {TargetEndpoints: eps[:1]}}})
	step(10, 1, 2)
	if n := kept(); n != 3 {
		t.Fatalf("stalled by a long prompt's prefill: %d kept, want 3", n)
	}
	chunk(f, eps[0], "long", false)
	chunk(f, eps[0], "warm-0", false)
	chunk(f, eps[0], "long", true)
	// Then server 0 slows down 10x: its stream stalls with nothing to explain it, while its peers keep their pace.
	step(3, 1, 2)
	clk.Step(19 * time.Millisecond)
	if n := kept(); n != 3 {
		t.Fatalf("a silence below 4x the usual gap: %d kept, want 3", n)
	}
	clk.Step(time.Millisecond)
	if n := kept(); n != 2 {
		t.Fatalf("a silence of 4x the usual gap with no prefill to explain it: %d kept, want 2", n)
	}
	// The stream ends: its server stays ejected for the base ejection time, then is picked again.
	chunk(f, eps[0], "warm-0", true)
	clk.Step(outlier.DefaultBaseEjectionTime - time.Millisecond)
	if n := kept(); n != 2 {
		t.Fatalf("during the ejection: %d kept, want 2", n)
	}
	clk.Step(time.Millisecond)
	if n := kept(); n != 3 {
		t.Fatalf("after the ejection: %d kept, want 3", n)
	}
}

// TestOutlierFilterAdapterLoad: a request sent to a server for a LoRA adapter the server may have to load (its latest
// scrape names its base models, and the adapter neither ran nor was resident there) explains, beside its prompt's
// prefill, 4 usual gaps more of the server's silence (vLLM loads the adapter inside the step, so every stream
// waits); a request for the base model, or for an adapter held there, or to a server that reports no residency,
// explains its prefill only. Past what the load explains, the silence still ejects.
func TestOutlierFilterAdapterLoad(t *testing.T) {
	const base = "meta-llama/Llama-3.1-8B-Instruct"
	served := func(adapters ...string) *LoRAResidency {
		return &LoRAResidency{BaseModels: map[string]struct{}{base: {}}, Adapters: lora.NewAdapters(adapters...), ObservedAt: fcT0}
	}
	tests := []struct {
		name      string
		model     string
		residency *LoRAResidency
		running   []string
		// wantKept is how many of the three servers are picked 140 ms after the request was sent (a prefill of one
		// usual gap, 20 ms, then 4 usual gaps of silence: 100 ms), and 180 ms after (a load's 4 usual gaps more).
		wantKept140, wantKept180 int
	}{
		{"an adapter not held there", "adapter-1", served("adapter-2"), nil, 3, 2},
		{"an adapter resident there", "adapter-1", served("adapter-1"), nil, 2, 2},
		{"an adapter running there", "adapter-1", served(), []string{"adapter-1"}, 2, 2},
		{"the base model", base, served("adapter-2"), nil, 2, 2},
		{"no residency reported", "adapter-1", nil, nil, 2, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(fcT0)
			f, eps := newOutlierFilter(t, "", clk)
			m := eps[0].GetMetrics().Clone()
			m.ActiveModels = map[string]int{}
			for _, a := range tt.running {
				m.ActiveModels[a] = 1
			}
			attrs := fwkdl.NewAttributes()
			if tt.residency != nil {
				attrs.Put(LoRAResidencyKey, tt.residency)
			}
			eps[0] = fwksched.NewEndpoint(eps[0].GetMetadata(), m, attrs)
			kept := func() int { return len(f.Filter(t.Context(), fwksched.NewCycleState(), nil, eps)) }
			step := streamSteps(clk, f, eps, false)
			step(100, 0, 1, 2)
			// 256 bytes: a prompt of about 64 tokens, one usual gap's prefill at the slowest rate.
			f.PreRequest(t.Context(), &fwksched.LLMRequest{RequestId: "q", TargetModel: tt.model, RequestSizeBytes: 256},
				&fwksched.SchedulingResult{PrimaryProfileName: "default",
					ProfileResults: map[string]*fwksched.ProfileRunResult{"default": {TargetEndpoints: eps[:1]}}})
			step(7, 1, 2)
			if n := kept(); n != tt.wantKept140 {
				t.Errorf("140 ms after the request: %d kept, want %d", n, tt.wantKept140)
			}
			step(2, 1, 2)
			if n := kept(); n != tt.wantKept180 {
				t.Errorf("180 ms after the request: %d kept, want %d", n, tt.wantKept180)
			}
		})
	}
}

// TestOutlierFilterStallRuleWithPeers: an EPP with peers (endpoint ownership, the peer exchange) does not see the
// prompts its peers send to a server, so their prefill would look like a stall: attached to its admission, the
// outlier filter's stall rule stands down unless ejectOnStall is set. Without peers, the requests a server's scrape
// shows beyond this EPP's explain its silence as prompts of the mean length sent (512 tokens here: 16 usual gaps for
// 2 of them). A server that slows down is ejected either way, by its stream's slow gaps.
func TestOutlierFilterStallRuleWithPeers(t *testing.T) {
	for _, tt := range []struct {
		name      string
		params    string
		ownership bool
		exchange  bool
		// scrapeInFlight: server 0's scrape, seen at a pick before the stall, shows this many requests (this EPP
		// has 1 there).
		scrapeInFlight int
		// stallEjects: a silence of 4 usual gaps with no prompt sent there ejects the server.
		stallEjects bool
	}{
		{name: "one EPP", stallEjects: true},
		{name: "endpoint ownership", ownership: true},
		{name: "peer exchange", ownership: true, exchange: true},
		{name: "peer exchange, ejectOnStall set true", params: `{"ejectOnStall": true}`, ownership: true, exchange: true, stallEjects: true},
		{name: "one EPP, ejectOnStall set false", params: `{"ejectOnStall": false}`},
		{name: "one EPP, only its own request in the scrape", scrapeInFlight: 1, stallEjects: true},
		{name: "one EPP, 2 others' requests in the scrape", scrapeInFlight: 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(fcT0)
			f, eps := newOutlierFilter(t, tt.params, clk)
			deps := FlowControlDeps{Endpoints: &fakePool{}, Clock: clk, Rand: rand.New(rand.NewPCG(1, 2))}
			if tt.ownership {
				view, err := replication.NewView("epp-a:9003", []string{"epp-a:9003", "epp-b:9003"}, time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				deps.Ownership = view
			}
			if tt.exchange {
				deps.Peers = replication.NewExchange("epp-a:9003", time.Second)
			}
			fc, err := NewFlowControl(flowcontrol.DefaultConfig(), FlowControlOptions{}, deps)
			if err != nil {
				t.Fatal(err)
			}
			fc.Attach(map[string]fwkplugin.Plugin{"outlier": f})
			kept := func() int { return len(f.Filter(t.Context(), fwksched.NewCycleState(), nil, eps)) }
			// Every server streams at 20 ms a chunk.
			step := func(n int, servers ...int) {
				for range n {
					clk.Step(20 * time.Millisecond)
					for _, i := range servers {
						chunk(f, eps[i], fmt.Sprint("warm-", i), false)
					}
				}
			}
			// One prompt of 512 tokens sent, to server 1: the mean length.
			f.PreRequest(t.Context(), &fwksched.LLMRequest{RequestId: "long", RequestSizeBytes: 2 << 10}, &fwksched.SchedulingResult{
				PrimaryProfileName: "default", ProfileResults: map[string]*fwksched.ProfileRunResult{"default": {TargetEndpoints: eps[1:2]}}})
			step(100, 0, 1, 2)
			if tt.scrapeInFlight > 0 {
				ep := upstreamEndpoint("10.0.0.1", tt.scrapeInFlight, 0, clk.Now())
				eps[0] = fwksched.NewEndpoint(ep.GetMetadata(), ep.GetMetrics(), fwkdl.NewAttributes())
				kept()
			}
			// Server 0 falls silent for 4 usual gaps (a peer's long prompt there, or a slowed server).
			step(4, 1, 2)
			if got, want := kept(), 3-b2i(tt.stallEjects); got != want {
				t.Fatalf("after a stall: %d kept, want %d", got, want)
			}
			// Server 0 streams 5x slower than its usual pace: 7 slow gaps eject it whatever the stall rule.
			chunk(f, eps[0], "warm-0", false)
			for range 7 {
				step(5, 1, 2)
				chunk(f, eps[0], "warm-0", false)
			}
			if got := kept(); got != 2 {
				t.Fatalf("after 7 slow gaps: %d kept, want 2", got)
			}
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
