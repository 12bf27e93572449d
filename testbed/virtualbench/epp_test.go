package virtualbench

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/testbed/eventclock"
	"github.com/sluice-gw/sluice/testbed/simulator"
	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

var ipT0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// testPool returns n endpoints named like static endpoints.
func testPool(n int) []eppEndpoint {
	eps := make([]eppEndpoint, n)
	for i := range eps {
		port := strconv.Itoa(28001 + i)
		eps[i] = eppEndpoint{Name: "static-127-0-0-1-" + port, Address: "127.0.0.1", Port: port}
	}
	return eps
}

// scrapeAll scrapes every endpoint with the simulator's metrics for the given waiting counts.
func scrapeAll(t *testing.T, p *inProcessEPP, clk *eventclock.Clock, waiting ...int) {
	t.Helper()
	cfg, _ := engine.Profile("h100")
	for i, w := range waiting {
		fams := simulator.MetricFamilies("m", cfg, engine.Stats{Waiting: w, Running: 4}, clk.Now())
		if err := p.Scrape(i, fams); err != nil {
			t.Fatal(err)
		}
	}
}

func ipChatRequest(id, objective, text string) eppRequest {
	body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 16, "stream": true,
		"messages": []map[string]string{{"role": "user", "content": text}}})
	h := map[string]string{":path": "/v1/chat/completions", ":method": "POST", "content-type": "application/json"}
	if objective != "" {
		h["x-gateway-inference-objective"] = objective
	}
	return eppRequest{ID: id, Headers: h, Body: body}
}

// route routes req and returns the answer if it came before Route returned.
func route(p *inProcessEPP, req eppRequest) (eppAnswer, bool) {
	var got eppAnswer
	answered := false
	p.Route(req, func(r eppAnswer) { got, answered = r, true })
	return got, answered
}

func newTestPicker(t *testing.T, opts eppOptions) (*inProcessEPP, *eventclock.Clock) {
	t.Helper()
	clk := eventclock.New(ipT0)
	opts.Clock = clk
	if opts.Objectives == nil {
		opts.Objectives = map[string]int{"critical": 10, "sheddable": -1}
	}
	p, err := newInProcessEPP(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, clk
}

func TestInProcessEPPUpstreamDefaultRoutesToTheShortestQueue(t *testing.T) {
	p, clk := newTestPicker(t, eppOptions{Endpoints: testPool(3), Seed: 1})
	scrapeAll(t, p, clk, 3, 0, 4)
	if m := p.endpoints[1].GetMetrics(); m.WaitingQueueSize != 0 || m.RunningRequestsSize != 4 || m.CacheBlockSize != 16 || !m.UpdateTime.Equal(ipT0) {
		t.Fatalf("scraped metrics %+v: want the simulator's values stamped with the picker's clock", m)
	}
	got, ok := route(p, ipChatRequest("r1", "", "hello"))
	if !ok || got.Endpoint != 1 {
		t.Fatalf("routed %+v (answered %v), want endpoint 1, the one with no queue", got, ok)
	}
	var body map[string]any
	if err := json.Unmarshal(got.Body, &body); err != nil || body["model"] != "m" {
		t.Fatalf("forwarded body %s: %v", got.Body, err)
	}
	if p.InFlight() != 1 {
		t.Fatalf("%d requests in flight, want 1", p.InFlight())
	}
	p.ResponseHeader("r1", map[string]string{"content-type": "text/event-stream"})
	p.ResponseComplete("r1", []byte("data: [DONE]\n\n"))
	if p.InFlight() != 0 {
		t.Fatalf("%d requests in flight after the response, want 0", p.InFlight())
	}
	if got, _ := route(p, eppRequest{ID: "bad", Headers: map[string]string{":path": "/v1/chat/completions"}, Body: []byte("{")}); got.Status != 400 {
		t.Fatalf("malformed body answered %+v, want 400", got)
	}
}

func TestInProcessEPPBreaksTiesBySeed(t *testing.T) {
	choices := func(seed uint64) string {
		p, clk := newTestPicker(t, eppOptions{Endpoints: testPool(8), Seed: seed})
		scrapeAll(t, p, clk, 0, 0, 0, 0, 0, 0, 0, 0)
		var out []string
		for i := range 40 {
			id := fmt.Sprintf("r%d", i)
			got, ok := route(p, ipChatRequest(id, "", fmt.Sprintf("question %d about something else entirely", i*7919)))
			if !ok || got.Endpoint < 0 {
				t.Fatalf("%s: %+v", id, got)
			}
			out = append(out, strconv.Itoa(got.Endpoint))
			p.ResponseComplete(id, nil)
		}
		return strings.Join(out, ",")
	}
	a, b, c := choices(1), choices(1), choices(2)
	if a != b {
		t.Fatalf("same seed, different choices:\n%s\n%s", a, b)
	}
	if a == c {
		t.Fatalf("seeds 1 and 2 broke every tie alike: %s", a)
	}
	if seen := map[string]bool{}; func() int {
		for _, e := range strings.Split(a, ",") {
			seen[e] = true
		}
		return len(seen)
	}() < 4 {
		t.Fatalf("ties among 8 idle endpoints went to fewer than 4 of them: %s", a)
	}
}

func TestInProcessEPPSluiceAdmission(t *testing.T) {
	p, clk := newTestPicker(t, eppOptions{Endpoints: testPool(2), Seed: 1, Admission: flowcontrol.DefaultConfig()})
	scrapeAll(t, p, clk, 20, 20) // above the queue-depth thresholds of both tiers: no headroom
	if err := p.SyncAdmission(); err != nil {
		t.Fatal(err)
	}
	var waiting eppAnswer
	answered := false
	p.Route(ipChatRequest("std", "", "hi"), func(r eppAnswer) { waiting, answered = r, true })
	if answered {
		t.Fatalf("a Standard request without headroom was answered at once: %+v", waiting)
	}
	if q := p.AdmissionQueue(); q[flowcontrol.Standard] != 1 {
		t.Fatalf("admission queues %v, want one Standard request", q)
	}
	shed, ok := route(p, ipChatRequest("shed", "sheddable", "hi"))
	if !ok || shed.Status != 429 || !shed.RetryAfterSet || shed.RetryAfter < time.Second || !strings.Contains(shed.Message, "saturated") {
		t.Fatalf("sheddable under saturation answered %+v, want 429 with Retry-After and the shed reason", shed)
	}
	gone := false
	p.Route(ipChatRequest("gone", "", "hi"), func(r eppAnswer) { gone = r.Cancelled })
	p.Cancel("gone")
	if !gone {
		t.Fatal("a cancelled waiting request was not answered Cancelled")
	}

	clk.Step(10 * time.Millisecond)
	scrapeAll(t, p, clk, 20, 0) // endpoint 1 has headroom again
	if err := p.SyncAdmission(); err != nil {
		t.Fatal(err)
	}
	if !answered || waiting.Endpoint != 1 {
		t.Fatalf("after headroom appeared: answered %v with %+v, want endpoint 1", answered, waiting)
	}
	p.ResponseComplete("std", nil)
	if p.InFlight() != 0 {
		t.Fatalf("%d requests in flight, want 0", p.InFlight())
	}

	// A request that waits past its band's maximum queue time is answered by the clock.
	sync := func() {
		scrapeAll(t, p, clk, 20, 20)
		if err := p.SyncAdmission(); err != nil {
			t.Fatal(err)
		}
	}
	sync()
	var late eppAnswer
	p.Route(ipChatRequest("late", "", "hi"), func(r eppAnswer) { late = r })
	for range 200 { // keep the metrics fresh, so the answer is a timeout and not "no endpoints"
		clk.Step(100 * time.Millisecond)
		sync()
		p.Resume()
	}
	if late.Status != 429 || !strings.Contains(late.Message, "queue_timeout") {
		t.Fatalf("a request past its maximum queue time was answered %+v, want 429 queue_timeout", late)
	}
}

func TestInProcessEPPLegacyAdmissionUsesTheClockForStaleness(t *testing.T) {
	p, clk := newTestPicker(t, eppOptions{Endpoints: testPool(2), Seed: 1})
	// Fresh metrics, queues below the utilization detector's threshold (5): sheddable requests pass.
	scrapeAll(t, p, clk, 1, 1)
	if got, _ := route(p, ipChatRequest("a", "sheddable", "hi")); got.Endpoint < 0 {
		t.Fatalf("sheddable request with fresh, unsaturated metrics answered %+v", got)
	}
	// The same metrics a virtual second later are stale for the detector (200ms), whatever the wall clock says.
	clk.Step(time.Second)
	got, _ := route(p, ipChatRequest("b", "sheddable", "hi"))
	if got.Status != 429 || got.RetryAfterSet {
		t.Fatalf("sheddable request on stale metrics answered %+v, want upstream's 429 without Retry-After", got)
	}
	if got, _ := route(p, ipChatRequest("c", "", "hi")); got.Endpoint < 0 {
		t.Fatalf("a Standard request is never shed by legacy admission, got %+v", got)
	}
}

func TestInProcessEPPRefusesNondeterministicPlugins(t *testing.T) {
	cfg := []byte(`apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: random-picker
`)
	_, err := newInProcessEPP(eppOptions{Config: cfg, Endpoints: testPool(2), Clock: eventclock.New(ipT0)})
	if err == nil || !strings.Contains(err.Error(), "random-picker") {
		t.Fatalf("error %v, want random-picker refused", err)
	}
	if _, err := newInProcessEPP(eppOptions{Endpoints: testPool(1)}); err == nil {
		t.Fatal("a picker without a clock was built")
	}
}

// TestInProcessEPPLoadsSluicePluginsOnItsClock: Sluice's default profile, loaded through the EPP's handle, reads
// the EPP's clock (plugins.ClockHandle) and runs the prefix cache's maintenance on it.
func TestInProcessEPPLoadsSluicePluginsOnItsClock(t *testing.T) {
	p, clk := newTestPicker(t, eppOptions{Endpoints: testPool(2), Seed: 3, Admission: flowcontrol.DefaultConfig()})
	if len(p.maintenance) != 1 {
		t.Fatalf("%d maintenance timers, want the prefix cache's pod sync", len(p.maintenance))
	}
	clk.Step(1234 * time.Millisecond)
	scrapeAll(t, p, clk, 0, 0)
	if err := p.SyncAdmission(); err != nil {
		t.Fatal(err)
	}
	v, ok := p.endpoints[0].GetAttributes().Get(plugins.LoRAResidencyKey)
	if res, _ := v.(*plugins.LoRAResidency); !ok || res == nil || !res.ObservedAt.Equal(clk.Now()) {
		t.Fatalf("the LoRA residency extractor stored %+v, want it observed at the EPP's time %v", v, clk.Now())
	}
	prompt := strings.Repeat("a shared system prompt ", 40)
	first, _ := route(p, ipChatRequest("r1", "", prompt+"one"))
	p.ResponseComplete("r1", nil)
	second, _ := route(p, ipChatRequest("r2", "", prompt+"two"))
	if first.Endpoint < 0 || second.Endpoint != first.Endpoint {
		t.Fatalf("a shared prefix went to %d then %d, want the same endpoint", first.Endpoint, second.Endpoint)
	}
	p.ResponseComplete("r2", nil)
	clk.Step(time.Minute) // the pod sync runs on the EPP's clock
	if p.Err() != nil || p.InFlight() != 0 {
		t.Fatalf("after the pod sync: error %v, %d requests in flight", p.Err(), p.InFlight())
	}
}
