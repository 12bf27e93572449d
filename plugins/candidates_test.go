package plugins

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/contracts"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/sluice-gw/sluice/flowcontrol"
)

// locateAll is the wrapped candidate source: every endpoint of the pool, in order.
type locateAll struct{ pool *fakePool }

func (l locateAll) Locate(context.Context, map[string]any) []fwkdl.Endpoint {
	return l.pool.PodList(func(fwkdl.Endpoint) bool { return true })
}

func locatedNames(eps []fwkdl.Endpoint) []string {
	out := make([]string, len(eps))
	for i, ep := range eps {
		out[i] = EndpointName(ep.GetMetadata())
	}
	return out
}

// narrowingPool is n endpoints 10.0.0.i:8000, endpoint i with waiting[i] queued requests (0 past the slice) and, when
// base[i] is set, serving that base model.
func narrowingPool(t *testing.T, n int, waiting []int, base map[int]string) (*FlowControl, contracts.EndpointCandidates, *fakePool) {
	t.Helper()
	cfg := flowcontrol.DefaultConfig()
	cfg.Endpoint.QueueDepth, cfg.Endpoint.BurstQueueDepth = 100, 0 // every endpoint keeps headroom: the ranking alone narrows
	pool := &fakePool{}
	fc, clk := newTestFlowControl(t, cfg, pool)
	eps := make([]fwkdl.Endpoint, n)
	for i := range eps {
		w := 0
		if i < len(waiting) {
			w = waiting[i]
		}
		eps[i] = upstreamEndpoint(fmt.Sprintf("10.0.0.%d", i), w, 0, clk.Now())
		if m, ok := base[i]; ok {
			eps[i].GetAttributes().Put(LoRAResidencyKey, &LoRAResidency{BaseModels: map[string]struct{}{m: {}}})
		}
	}
	pool.set(eps...)
	if err := fc.SyncEndpoints(); err != nil {
		t.Fatal(err)
	}
	return fc, fc.NarrowCandidates(locateAll{pool}), pool
}

// admitted admits a request for model through fc and returns the Locate context the runner gives its Director.
func admitted(t *testing.T, fc *FlowControl, id, model string) context.Context {
	t.Helper()
	rc := requestContext(id, "t", 10, nil)
	rc.TargetModelName = model
	if err := fc.Admit(context.Background(), rc, 0); err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	return WithRequestID(context.Background(), func() string { return id })
}

func TestNarrowCandidates(t *testing.T) {
	max := DefaultMaxCandidates
	loaded := make([]int, max+8) // the first 8 endpoints are busy, the rest idle
	for i := range 8 {
		loaded[i] = 50 + i
	}
	idle := func(from, to int) []string {
		var out []string
		for i := from; i < to; i++ {
			out = append(out, fmt.Sprintf("10.0.0.%d:8000", i))
		}
		return out
	}
	tests := []struct {
		name    string
		n       int
		waiting []int
		base    map[int]string
		model   string
		admit   bool // admit the request through Sluice admission first
		noID    bool // the Locate context carries no request ID
		want    []string
	}{
		{"a pool of at most MaxCandidates is not narrowed", max, loaded, nil, "", true, false, idle(0, max)},
		{"a request admission did not dispatch is not narrowed", max + 8, loaded, nil, "", false, false, idle(0, max+8)},
		{"a context without a request ID is not narrowed", max + 8, loaded, nil, "", true, true, idle(0, max+8)},
		{"the least loaded, in located order", max + 8, loaded, nil, "", true, false, idle(8, max+8)},
		{"only servers of the request's model, when some serve it", max + 8, loaded,
			map[int]string{3: "m", 20: "m", 30: "other"}, "m", true, false, []string{"10.0.0.3:8000", "10.0.0.20:8000"}},
		{"every server when none serves the model", max + 8, loaded, map[int]string{3: "other"}, "m", true, false,
			idle(8, max+8)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fc, cands, _ := narrowingPool(t, tt.n, tt.waiting, tt.base)
			ctx := WithRequestID(context.Background(), func() string { return "r1" })
			if tt.admit {
				ctx = admitted(t, fc, "r1", tt.model)
			}
			if tt.noID {
				ctx = context.Background()
			}
			if got := locatedNames(cands.Locate(ctx, nil)); !slices.Equal(got, tt.want) {
				t.Fatalf("Locate = %v\nwant %v", got, tt.want)
			}
		})
	}
}

// TestNarrowCandidatesRotatesTies: on an idle pool every endpoint ranks the same; successive requests must not all be
// narrowed to the same MaxCandidates endpoints (as a scan from the first would), or the rest of the pool never serves.
func TestNarrowCandidatesRotatesTies(t *testing.T) {
	n := 4 * DefaultMaxCandidates
	fc, cands, _ := narrowingPool(t, n, nil, nil)
	seen := map[string]bool{}
	for i := range n {
		id := fmt.Sprint("r", i)
		got := cands.Locate(admitted(t, fc, id, ""), nil)
		if len(got) != DefaultMaxCandidates {
			t.Fatalf("%s: %d candidates, want %d", id, len(got), DefaultMaxCandidates)
		}
		for _, name := range locatedNames(got) {
			seen[name] = true
		}
		fc.ctrl.Release(id) // keep the pool idle: only the tie-break varies
	}
	if len(seen) != n {
		t.Fatalf("%d requests were narrowed to %d distinct endpoints, want all %d", n, len(seen), n)
	}
}

// TestNarrowCandidatesSeesEachDispatch: a request dispatched to an endpoint counts there at once, so the next
// request's candidates move on before any new scrape.
func TestNarrowCandidatesSeesEachDispatch(t *testing.T) {
	waiting := make([]int, DefaultMaxCandidates+1)
	for i := range waiting {
		waiting[i] = 10 // busy, except the last endpoint
	}
	waiting[DefaultMaxCandidates] = 0
	fc, cands, _ := narrowingPool(t, DefaultMaxCandidates+1, waiting, nil)
	first := locatedNames(cands.Locate(admitted(t, fc, "r1", ""), nil))
	idle := fmt.Sprintf("10.0.0.%d:8000", DefaultMaxCandidates)
	if !slices.Contains(first, idle) {
		t.Fatalf("r1's candidates %v miss the idle endpoint", first)
	}
	fc.ctrl.Bind("r1", idle)
	for i := range 12 { // the idle endpoint now ranks behind the others: 12 more dispatches there
		id := fmt.Sprint("fill", i)
		admitted(t, fc, id, "")
		fc.ctrl.Bind(id, idle)
	}
	if got := locatedNames(cands.Locate(admitted(t, fc, "r2", ""), nil)); slices.Contains(got, idle) {
		t.Fatalf("r2's candidates %v still hold %s, which 13 dispatches since the scrape made the busiest", got, idle)
	}
}

func TestNarrowCandidatesOff(t *testing.T) {
	pool := &fakePool{}
	fc, err := NewFlowControl(nil, FlowControlOptions{MaxCandidates: -1}, FlowControlDeps{Endpoints: pool})
	if err != nil {
		t.Fatal(err)
	}
	inner := locateAll{pool}
	if got := fc.NarrowCandidates(inner); got != contracts.EndpointCandidates(inner) {
		t.Fatalf("NarrowCandidates with MaxCandidates -1 = %T, want the inner candidates", got)
	}
}

// TestFlowControlNameOf: names come from the last snapshot for the metadata it held; metadata the datastore replaced
// since (a new pointer, say a new address) is named afresh.
func TestFlowControlNameOf(t *testing.T) {
	fc, _, pool := narrowingPool(t, 2, nil, nil)
	known := pool.eps[0].GetMetadata()
	if got := fc.nameOf(known); got != "10.0.0.0:8000" {
		t.Fatalf("nameOf(snapshot metadata) = %q", got)
	}
	replaced := &fwkdl.EndpointMetadata{Address: "10.0.9.9", Port: "8001"}
	pool.eps[0].(*fwkdl.ModelServer).UpdateMetadata(replaced)
	if got := fc.nameOf(pool.eps[0].GetMetadata()); got != "10.0.9.9:8001" {
		t.Fatalf("nameOf(replaced metadata) = %q, want 10.0.9.9:8001", got)
	}
}

// TestNarrowCandidatesKeepsHeadroom: when none of the least loaded endpoints had headroom for the request at dispatch
// (under the Critical seat reserve a lightly loaded seat-bound endpoint keeps its idle seats for Critical), the
// endpoints that had it must be among the candidates, or the headroom filter, finding none, restricts nothing.
func TestNarrowCandidatesKeepsHeadroom(t *testing.T) {
	max := DefaultMaxCandidates
	loaded := make([]int, max+8) // the first 8 endpoints are busy, the rest idle
	for i := range 8 {
		loaded[i] = 50 + i
	}
	tests := []struct {
		name     string
		headroom []string
		want     []string // must be among the candidates
		wantN    int
	}{
		{"one busy endpoint had headroom", []string{"10.0.0.3:8000"}, []string{"10.0.0.3:8000"}, max},
		{"two busy ones had", []string{"10.0.0.1:8000", "10.0.0.6:8000"}, []string{"10.0.0.1:8000", "10.0.0.6:8000"}, max},
		{"an idle one had: ranking alone decides", []string{"10.0.0.20:8000"}, []string{"10.0.0.20:8000"}, max},
		{"no list: ranking alone decides", nil, []string{"10.0.0.8:8000", "10.0.0.39:8000"}, max},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fc, cands, _ := narrowingPool(t, max+8, loaded, nil)
			ctx := admitted(t, fc, "r1", "")
			sd, ok := fc.headroom.get("r1")
			if !ok {
				t.Fatal("r1's decision is not stored")
			}
			sd.decision.Endpoints = tt.headroom
			fc.headroom.put("r1", sd)
			got := locatedNames(cands.Locate(ctx, nil))
			if len(got) != tt.wantN {
				t.Fatalf("%d candidates, want %d", len(got), tt.wantN)
			}
			for _, w := range tt.want {
				if !slices.Contains(got, w) {
					t.Fatalf("candidates %v miss %s", got, w)
				}
			}
		})
	}
}
