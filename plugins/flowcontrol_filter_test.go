package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	k8stypes "k8s.io/apimachinery/pkg/types"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/sluice-gw/sluice/flowcontrol"
)

func mustHeadroomFilter(t testing.TB) *HeadroomFilter {
	t.Helper()
	p, err := HeadroomFilterFactory("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*HeadroomFilter)
}

func candidates(addrs ...string) []fwksched.Endpoint {
	eps := make([]fwksched.Endpoint, len(addrs))
	for i, a := range addrs {
		eps[i] = fwksched.NewEndpoint(&fwkdl.EndpointMetadata{Address: a, Port: "8000"}, fwkdl.NewMetrics(), nil)
	}
	return eps
}

func names(eps []fwksched.Endpoint) []string {
	out := make([]string, len(eps))
	for i, ep := range eps {
		out[i] = EndpointName(ep.GetMetadata())
	}
	return out
}

func TestHeadroomFilterRestrictsCandidates(t *testing.T) {
	many := make([]string, 40)
	for i := range many {
		many[i] = fmt.Sprintf("10.0.1.%d", i)
	}
	manyAllowed := []string{"10.0.1.3:8000", "10.0.1.39:8000", "10.0.1.17:8000"}
	allButTwo := make([]string, 0, len(many))
	for _, a := range many {
		if a != "10.0.1.5" && a != "10.0.1.9" {
			allButTwo = append(allButTwo, a+":8000")
		}
	}
	few := many[:20] // narrowed candidates: fewer than the endpoints with headroom
	tests := []struct {
		name       string
		attached   bool
		stored     []string // the request's Decision.Endpoints; nil stores nothing
		candidates []string
		want       []string
	}{
		{"keeps only endpoints with headroom, in candidate order", true,
			[]string{"10.0.0.3:8000", "10.0.0.1:8000"}, []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"},
			[]string{"10.0.0.1:8000", "10.0.0.3:8000"}},
		{"large pools take the map path", true, manyAllowed, many,
			[]string{"10.0.1.3:8000", "10.0.1.17:8000", "10.0.1.39:8000"}},
		{"few candidates among many with headroom", true, allButTwo, few,
			allButTwo[:18]},
		{"unknown request filters nothing", true, nil, []string{"10.0.0.1", "10.0.0.2"},
			[]string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"no overlap filters nothing rather than fail scheduling", true,
			[]string{"10.0.0.9:8000"}, []string{"10.0.0.1", "10.0.0.2"}, []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"not attached (Sluice admission off) filters nothing", false,
			[]string{"10.0.0.1:8000"}, []string{"10.0.0.1", "10.0.0.2"}, []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fc, _ := newTestFlowControl(t, nil, &fakePool{})
			f := mustHeadroomFilter(t)
			if tt.attached {
				fc.Attach(map[string]fwkplugin.Plugin{"f": f})
			}
			if tt.stored != nil {
				fc.headroom.put("req", storedDecision{decision: flowcontrol.Decision{Outcome: flowcontrol.Dispatched, Endpoints: tt.stored}})
			}
			got := names(f.Filter(context.Background(), fwksched.NewCycleState(), &fwksched.LLMRequest{RequestId: "req"}, candidates(tt.candidates...)))
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Filter = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestHeadroomFilterThroughAdmission checks the filter end to end inside the EPP's request path: a Sheddable request
// dispatched while one endpoint is above the Sheddable ceiling is scheduled only among the others.
func TestHeadroomFilterThroughAdmission(t *testing.T) {
	pool := &fakePool{}
	fc, clk := newTestFlowControl(t, nil, pool)
	// Default KV threshold 0.8: 50% KV use is saturation 0.625, above the Sheddable ceiling (0.6) but below
	// Standard's (0.8); 10% is 0.125.
	pool.set(upstreamEndpoint("10.0.0.1", 0, 0.5, clk.Now()), upstreamEndpoint("10.0.0.2", 0, 0.1, clk.Now()))
	if err := fc.SyncEndpoints(); err != nil {
		t.Fatal(err)
	}
	f := mustHeadroomFilter(t)
	fc.Attach(map[string]fwkplugin.Plugin{HeadroomFilterType: f})
	if err := fc.Admit(context.Background(), requestContext("shed-me-not", "t", 100, nil), -1); err != nil {
		t.Fatal(err)
	}
	got := names(f.Filter(context.Background(), fwksched.NewCycleState(), &fwksched.LLMRequest{RequestId: "shed-me-not"}, candidates("10.0.0.1", "10.0.0.2")))
	if !slices.Equal(got, []string{"10.0.0.2:8000"}) {
		t.Fatalf("Sheddable request may be scheduled on %v, want only 10.0.0.2:8000", got)
	}
	// A Standard request may use both (ceiling 0.8).
	if err := fc.Admit(context.Background(), requestContext("standard", "t", 100, nil), 0); err != nil {
		t.Fatal(err)
	}
	got = names(f.Filter(context.Background(), fwksched.NewCycleState(), &fwksched.LLMRequest{RequestId: "standard"}, candidates("10.0.0.1", "10.0.0.2")))
	if len(got) != 2 {
		t.Fatalf("Standard request may be scheduled on %v, want both", got)
	}
}

func TestHeadroomFilterFactory(t *testing.T) {
	for _, raw := range []string{"", "null", "{}", " { } "} {
		p, err := HeadroomFilterFactory("mine", json.RawMessage(raw), nil)
		if err != nil {
			t.Fatalf("params %q: %v", raw, err)
		}
		if tn := p.TypedName(); tn.Type != HeadroomFilterType || tn.Name != "mine" {
			t.Fatalf("TypedName = %+v", tn)
		}
	}
	for _, raw := range []string{`{"ceiling":1}`, `[1]`, `{`} {
		if _, err := HeadroomFilterFactory("x", json.RawMessage(raw), nil); err == nil {
			t.Fatalf("params %q accepted", raw)
		}
	}
	if sluicePlugins[HeadroomFilterType] == nil {
		t.Fatalf("%s is not registered", HeadroomFilterType)
	}
}

// TestHeadroomFilterKeepsPrefixAffinity: with one prefix-cache scorer attached, an endpoint without headroom stays a
// candidate when it holds at least half the prompt more than every endpoint with headroom, unless the scorer's
// overload guard voids its match or flow control forbids it (stale metrics, a holdback band, a band below Critical
// under the Critical reserve); with no or two prefix-cache scorers nothing is added.
func TestHeadroomFilterKeepsPrefixAffinity(t *testing.T) {
	endpoint := func(i int, waiting int) fwksched.Endpoint {
		return fwksched.NewEndpoint(&fwkdl.EndpointMetadata{
			NamespacedName: k8stypes.NamespacedName{Namespace: "default", Name: fmt.Sprintf("pod-%d", i)},
			Address:        fmt.Sprintf("10.0.0.%d", i), Port: "8000",
		}, &fwkdl.Metrics{CacheBlockSize: 16, CacheNumBlocks: 1000, WaitingQueueSize: waiting}, nil)
	}
	system := chatMsg("system", strings.Repeat("You are a careful assistant. ", 40))
	cached := chatRequest("req", system, chatMsg("user", "Summarise the report."))
	// The same system prompt, then a question that makes it about 70% or 30% of the prompt.
	mostly := chatRequest("req", system, chatMsg("user", strings.Repeat("Why? ", 100)))
	partly := chatRequest("req", system, chatMsg("user", strings.Repeat("Why? ", 500)))
	tests := []struct {
		name     string
		prefix   int // prefix-cache scorers attached
		routedTo int // endpoint index cached was routed to before; -1 none
		waiting  int // waiting queue of that endpoint (the guard voids affinity far above the pool's load)
		req      *fwksched.LLMRequest
		band     flowcontrol.Band
		critical bool // a Critical request was admitted just before: the Critical reserve is on
		stale    bool // the holder's metrics are stale
		want     []string
	}{
		{"holder without headroom stays", 1, 2, 0, cached, flowcontrol.Standard, false, false, []string{"10.0.0.0:8000", "10.0.0.2:8000"}},
		{"holder of 70% of the prompt stays", 1, 2, 0, mostly, flowcontrol.Standard, false, false, []string{"10.0.0.0:8000", "10.0.0.2:8000"}},
		{"holder of 30% of the prompt: below the margin", 1, 2, 0, partly, flowcontrol.Standard, false, false, []string{"10.0.0.0:8000"}},
		{"holder with headroom: nothing added", 1, 0, 0, cached, flowcontrol.Standard, false, false, []string{"10.0.0.0:8000"}},
		{"no match anywhere: nothing added", 1, -1, 0, cached, flowcontrol.Standard, false, false, []string{"10.0.0.0:8000"}},
		{"overloaded holder: the guard voids its match", 1, 2, 50, cached, flowcontrol.Standard, false, false, []string{"10.0.0.0:8000"}},
		{"holdback band keeps to its ceiling", 1, 2, 0, cached, flowcontrol.Sheddable, false, false, []string{"10.0.0.0:8000"}},
		{"Standard under the Critical reserve keeps to its headroom", 1, 2, 0, cached, flowcontrol.Standard, true, false, []string{"10.0.0.0:8000"}},
		{"Critical under the Critical reserve may use the holder", 1, 2, 0, cached, flowcontrol.Critical, true, false, []string{"10.0.0.0:8000", "10.0.0.2:8000"}},
		{"holder with stale metrics", 1, 2, 0, cached, flowcontrol.Standard, false, true, []string{"10.0.0.0:8000"}},
		{"no prefix-cache scorer", 0, 2, 0, cached, flowcontrol.Standard, false, false, []string{"10.0.0.0:8000"}},
		{"two prefix-cache scorers: ambiguous, none used", 2, 2, 0, cached, flowcontrol.Standard, false, false, []string{"10.0.0.0:8000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eps := []fwksched.Endpoint{endpoint(0, 0), endpoint(1, 0), endpoint(2, 0)}
			if tt.waiting > 0 {
				eps[tt.routedTo] = endpoint(tt.routedTo, tt.waiting)
			}
			plugins := map[string]fwkplugin.Plugin{}
			var scorers []*PrefixCache
			for i := range tt.prefix {
				p := newTestPrefixCache(t, "")
				scorers = append(scorers, p)
				plugins[fmt.Sprintf("prefix-%d", i)] = p
			}
			if tt.routedTo >= 0 {
				for _, p := range scorers {
					routeTo(p, cached, eps[tt.routedTo])
				}
			}
			pool := &fakePool{}
			fc, clk := newTestFlowControl(t, nil, pool)
			holderScraped := clk.Now()
			if tt.stale {
				holderScraped = holderScraped.Add(-time.Hour)
			}
			pool.set(upstreamEndpoint("10.0.0.0", 0, 0, clk.Now()), upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()),
				upstreamEndpoint("10.0.0.2", 0, 0, holderScraped))
			if err := fc.SyncEndpoints(); err != nil {
				t.Fatal(err)
			}
			if tt.critical {
				if err := fc.Admit(context.Background(), requestContext("urgent", "t", 10, nil), 1); err != nil {
					t.Fatal(err)
				}
			}
			f := mustHeadroomFilter(t)
			plugins["f"] = f
			fc.Attach(plugins)
			fc.headroom.put("req", storedDecision{decision: flowcontrol.Decision{Outcome: flowcontrol.Dispatched, Band: tt.band, Endpoints: []string{"10.0.0.0:8000"}}})
			got := names(f.Filter(context.Background(), fwksched.NewCycleState(), tt.req, eps))
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Filter = %v, want %v", got, tt.want)
			}
		})
	}
}
