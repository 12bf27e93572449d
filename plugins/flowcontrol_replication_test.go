package plugins

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	k8stypes "k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/flowcontrol/replication"
)

// TestFlowControlAdmitsOnOwnedEndpoints runs two replicas' admission over one pool: while they hear each other each
// hands the scheduler only its own endpoints, the two shares covering the pool once; when one falls silent the
// survivor, deciding alone, takes every endpoint at its first snapshot after the membership timeout.
func TestFlowControlAdmitsOnOwnedEndpoints(t *testing.T) {
	const timeout = 150 * time.Millisecond
	clk := clocktesting.NewFakeClock(fcT0)
	pool := &fakePool{}
	var all []string
	var eps []fwkdl.Endpoint
	for _, addr := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"} {
		all = append(all, addr+":8000")
		eps = append(eps, upstreamEndpoint(addr, 0, 0, clk.Now()))
	}
	pool.set(eps...)
	peers := []string{"epp-a:9003", "epp-b:9003"}
	replica := func(self string) (*FlowControl, *replication.View) {
		view, err := replication.NewView(self, peers, timeout)
		if err != nil {
			t.Fatal(err)
		}
		fc, err := NewFlowControl(flowcontrol.DefaultConfig(), FlowControlOptions{}, FlowControlDeps{
			Endpoints: pool, Clock: clk, Rand: rand.New(rand.NewPCG(1, 2)), Ownership: view})
		if err != nil {
			t.Fatal(err)
		}
		fc.Attach(map[string]fwkplugin.Plugin{"headroom": mustHeadroomFilter(t)})
		return fc, view
	}
	a, viewA := replica("epp-a:9003")
	b, viewB := replica("epp-b:9003")
	admit := func(fc *FlowControl, id string) []string {
		t.Helper()
		if err := fc.SyncEndpoints(); err != nil {
			t.Fatal(err)
		}
		if err := fc.Admit(context.Background(), requestContext(id, "t", 10, nil), 0); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		sd, _ := fc.headroom.get(id)
		got := slices.Clone(sd.decision.Endpoints)
		slices.Sort(got)
		return got
	}

	if got := admit(a, "alone"); !slices.Equal(got, all) {
		t.Fatalf("a, hearing no peer, may use %v, want the whole pool %v", got, all)
	}
	viewA.Heard("epp-b:9003", clk.Now())
	viewB.Heard("epp-a:9003", clk.Now())
	ownedA, ownedB := admit(a, "a1"), admit(b, "b1")
	if len(ownedA) != 2 || len(ownedB) != 2 {
		t.Fatalf("two live replicas may use %v and %v, want two endpoints each", ownedA, ownedB)
	}
	if both := slices.Sorted(slices.Values(append(slices.Clone(ownedA), ownedB...))); !slices.Equal(both, all) {
		t.Fatalf("shares %v and %v do not cover the pool once", ownedA, ownedB)
	}

	// b dies: a hears it no more. Within the timeout a keeps its share; at the timeout it owns the pool.
	clk.Step(timeout - time.Millisecond)
	pool.set(refreshed(eps, clk.Now())...)
	if got := admit(a, "a2"); !slices.Equal(got, ownedA) {
		t.Fatalf("b heard %v ago: a may use %v, want its share %v", timeout-time.Millisecond, got, ownedA)
	}
	clk.Step(time.Millisecond)
	pool.set(refreshed(eps, clk.Now())...)
	if got := admit(a, "a3"); !slices.Equal(got, all) {
		t.Fatalf("b silent for %v: a may use %v, want the whole pool", timeout, got)
	}
}

// refreshed returns eps as scraped again, idle, at now.
func refreshed(eps []fwkdl.Endpoint, now time.Time) []fwkdl.Endpoint {
	out := make([]fwkdl.Endpoint, len(eps))
	for i, ep := range eps {
		out[i] = upstreamEndpoint(ep.GetMetadata().GetIPAddress(), 0, 0, now)
	}
	return out
}

// TestFlowControlOwnedShareEjected: a replica whose every owned endpoint is ejected admits on the whole pool, so its
// requests go to its peer's healthy endpoint rather than wait for an ejection to end.
func TestFlowControlOwnedShareEjected(t *testing.T) {
	clk := clocktesting.NewFakeClock(fcT0)
	pool := &fakePool{}
	endpoints := func() []fwkdl.Endpoint {
		return []fwkdl.Endpoint{upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()), upstreamEndpoint("10.0.0.2", 0, 0, clk.Now())}
	}
	pool.set(endpoints()...)
	view, err := replication.NewView("epp-a:9003", []string{"epp-a:9003", "epp-b:9003"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	view.Heard("epp-b:9003", clk.Now())
	fc, err := NewFlowControl(flowcontrol.DefaultConfig(), FlowControlOptions{}, FlowControlDeps{
		Endpoints: pool, Clock: clk, Rand: rand.New(rand.NewPCG(1, 2)), Ownership: view})
	if err != nil {
		t.Fatal(err)
	}
	p, err := OutlierFilterFactory("", nil, clockHandle{clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	outliers := p.(*OutlierFilter)
	fc.Attach(map[string]fwkplugin.Plugin{"headroom": mustHeadroomFilter(t), "outlier": outliers})
	admit := func(id string, band int) []string {
		t.Helper()
		pool.set(endpoints()...)
		if err := fc.SyncEndpoints(); err != nil {
			t.Fatal(err)
		}
		if err := fc.Admit(context.Background(), requestContext(id, "t", 10, nil), band); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		sd, _ := fc.headroom.get(id)
		return slices.Clone(sd.decision.Endpoints)
	}
	owned := admit("before", 0)
	if len(owned) != 1 {
		t.Fatalf("a may use %v, want its one endpoint of two", owned)
	}
	var mine, peers fwksched.Endpoint
	for _, ep := range pool.PodList(allEndpoints) {
		e := fwksched.NewEndpoint(ep.GetMetadata(), ep.GetMetrics(), fwkdl.NewAttributes())
		if EndpointName(ep.GetMetadata()) == owned[0] {
			mine = e
		} else {
			peers = e
		}
	}
	respond(outliers, mine, "500")
	respond(outliers, peers, "200")
	respond(outliers, mine, "500") // the local rule ejects a's only endpoint
	got := admit("after", -1)      // Sheddable: shed at once, not kept waiting, where no endpoint has headroom
	if want := []string{EndpointName(peers.GetMetadata())}; !slices.Equal(got, want) {
		t.Fatalf("with its share ejected a may use %v, want its peer's healthy endpoint %v", got, want)
	}
}

// twoPeerReplicas is replicas epp-a and epp-b of admission over two endpoints of one slot each (peerReplica).
func twoPeerReplicas(t *testing.T, steer bool) (clk *clocktesting.FakeClock, pool *fakePool, a, b *FlowControl) {
	t.Helper()
	clk = clocktesting.NewFakeClock(fcT0)
	pool = &fakePool{}
	pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()), upstreamEndpoint("10.0.0.2", 0, 0, clk.Now()))
	peers := []string{"epp-a:9003", "epp-b:9003"}
	cfg := flowcontrol.DefaultConfig()
	cfg.Endpoint.Concurrency = 1
	return clk, pool, peerReplica(t, clk, pool, cfg, peers, peers[0], steer), peerReplica(t, clk, pool, cfg, peers, peers[1], steer)
}

// peerReplica is admission cfg over pool for replica self among peers, all live, exchanging summaries; steer attaches
// the headroom filter (without it, and without candidate narrowing, nothing would schedule a request sent to a peer's
// endpoint there).
func peerReplica(t *testing.T, clk *clocktesting.FakeClock, pool *fakePool, cfg *flowcontrol.Config, peers []string, self string, steer bool) *FlowControl {
	t.Helper()
	var attach map[string]fwkplugin.Plugin
	if steer {
		attach = map[string]fwkplugin.Plugin{"headroom": mustHeadroomFilter(t)}
	}
	return peerReplicaWith(t, clk, pool, cfg, peers, self, attach)
}

// peerReplicaWith is peerReplica with the plugins attach attached (none if nil).
func peerReplicaWith(t *testing.T, clk *clocktesting.FakeClock, pool *fakePool, cfg *flowcontrol.Config, peers []string, self string,
	attach map[string]fwkplugin.Plugin) *FlowControl {
	t.Helper()
	view, err := replication.NewView(self, peers, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range peers {
		view.Heard(p, clk.Now())
	}
	fc, err := NewFlowControl(cfg, FlowControlOptions{}, FlowControlDeps{Endpoints: pool, Clock: clk,
		Rand: rand.New(rand.NewPCG(1, 2)), Ownership: view, Peers: replication.NewExchange(self, time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if attach != nil {
		fc.Attach(attach)
	}
	if err := fc.SyncEndpoints(); err != nil {
		t.Fatal(err)
	}
	return fc
}

// TestFlowControlPeerExchange runs two replicas that exchange summaries (in their wire form): a Critical request that
// would wait on a's one endpoint goes at once to b's idle seat; b, told of it, holds that seat for it and gives it to
// its own waiting request only once a says it ended. Without a live peer, a decides alone and its Critical waits.
func TestFlowControlPeerExchange(t *testing.T) {
	// steer: the headroom filter is attached. Without it (and without candidate narrowing) nothing would schedule a
	// request sent to a peer's endpoint there, so none is sent.
	for _, steer := range []bool{true, false} {
		t.Run(fmt.Sprintf("steer=%v", steer), func(t *testing.T) {
			clk, pool, a, b := twoPeerReplicas(t, steer)
			send := func(from, to *FlowControl) { sendSummary(t, from, to) }
			type outcome struct {
				done      bool
				err       error
				endpoints []string
			}
			submit := func(fc *FlowControl, id string, priority int) *outcome {
				o := &outcome{}
				fc.Submit(requestContext(id, "t", 10, nil), priority, func(err error, _ bool) {
					o.done, o.err = true, err
					sd, _ := fc.headroom.get(id)
					o.endpoints = sd.decision.Endpoints
				})
				return o
			}
			send(a, b)
			send(b, a)

			mine := submit(a, "a-c1", 1)
			if !mine.done || mine.err != nil || (steer && len(mine.endpoints) != 1) {
				t.Fatalf("a's first Critical request: %+v, want it dispatched to a's endpoint", mine)
			}
			sent := submit(a, "a-c2", 1)
			if !steer {
				if sent.done {
					t.Fatalf("a's second Critical request %+v went to b's endpoint with nothing to schedule it there", sent)
				}
				return
			}
			if !sent.done || sent.err != nil || len(sent.endpoints) != 1 || sent.endpoints[0] == mine.endpoints[0] {
				t.Fatalf("a's second Critical request: %+v, want it dispatched at once to b's endpoint", sent)
			}
			send(a, b) // b learns of a-c2 on its endpoint
			waiting := submit(b, "b-s1", 0)
			if waiting.done {
				t.Fatalf("b's Standard request %+v was dispatched onto the seat a's Critical request holds", waiting)
			}
			a.ResponseBody(context.Background(), &fwksched.LLMRequest{RequestId: "a-c2"}, &fwkrc.Response{EndOfStream: true}, nil)
			send(a, b) // b learns that it ended
			if !waiting.done || waiting.err != nil {
				t.Fatalf("b's Standard request %+v, want it dispatched once a's request ended", waiting)
			}

			// b falls silent: a decides alone, on its own endpoint, and its next Critical request waits there.
			clk.Step(2 * time.Second)
			pool.set(refreshed(pool.PodList(allEndpoints), clk.Now())...)
			if err := a.SyncEndpoints(); err != nil {
				t.Fatal(err)
			}
			if alone := submit(a, "a-c3", 1); alone.done {
				t.Fatalf("with b silent, a's Critical request %+v went elsewhere, want it waiting", alone)
			}
		})
	}
}

// TestFlowControlSharesPrefixWithPeers: two replicas owning one endpoint each, both with a prefix-cache scorer. A
// prompt b routed to its endpoint reaches a's prefix index with b's next summary; from then on a's headroom filter
// keeps b's endpoint as a candidate for that prompt (it holds all of it, a's own endpoint none), and a request a's
// scheduler places there counts, in a's summaries, as a's request on b's endpoint until it ends. A Sheddable request
// (a holdback band) is not sent to the peer's endpoint.
func TestFlowControlSharesPrefixWithPeers(t *testing.T) {
	clk := clocktesting.NewFakeClock(fcT0)
	pool := &fakePool{}
	pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()), upstreamEndpoint("10.0.0.2", 0, 0, clk.Now()))
	sched := map[string]fwksched.Endpoint{}
	for i, addr := range []string{"10.0.0.1", "10.0.0.2"} {
		sched[addr+":8000"] = fwksched.NewEndpoint(&fwkdl.EndpointMetadata{
			NamespacedName: k8stypes.NamespacedName{Namespace: "default", Name: fmt.Sprintf("pod-%d", i)},
			Address:        addr, Port: "8000",
		}, &fwkdl.Metrics{CacheBlockSize: 16, CacheNumBlocks: 1000}, nil)
	}
	peers := []string{"epp-a:9003", "epp-b:9003"}
	type replica struct {
		fc     *FlowControl
		prefix *PrefixCache
		filter *HeadroomFilter
	}
	newReplica := func(self string) replica {
		r := replica{prefix: newTestPrefixCache(t, ""), filter: mustHeadroomFilter(t)}
		r.fc = peerReplicaWith(t, clk, pool, flowcontrol.DefaultConfig(), peers, self,
			map[string]fwkplugin.Plugin{"prefix": r.prefix, "headroom": r.filter})
		return r
	}
	a, b := newReplica("epp-a:9003"), newReplica("epp-b:9003")
	sendSummary(t, a.fc, b.fc)
	sendSummary(t, b.fc, a.fc)
	all := []fwksched.Endpoint{sched["10.0.0.1:8000"], sched["10.0.0.2:8000"]}
	system := chatMsg("system", strings.Repeat("You are a careful assistant. ", 40))
	request := func(id string) *fwksched.LLMRequest { return chatRequest(id, system, chatMsg("user", "Summarise.")) }
	// candidates admits id at a as Standard and returns what a's headroom filter keeps of the pool for it.
	candidates := func(id string) []string {
		t.Helper()
		if err := a.fc.Admit(context.Background(), requestContext(id, "t", 10, nil), 0); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		a.prefix.Score(context.Background(), nil, request(id), all) // every scheduling cycle scores the pool
		return names(a.filter.Filter(context.Background(), fwksched.NewCycleState(), request(id), all))
	}
	own := candidates("a1")
	if len(own) != 1 {
		t.Fatalf("a keeps %v, want its own endpoint alone", own)
	}
	peer := "10.0.0.1:8000"
	if own[0] == peer {
		peer = "10.0.0.2:8000"
	}
	routeTo(b.prefix, request("b1"), sched[peer])
	if got := candidates("a2"); !slices.Equal(got, own) {
		t.Fatalf("before b's summary a keeps %v, want %v", got, own)
	}
	sendSummary(t, b.fc, a.fc)
	if got := candidates("a3"); len(got) != 2 {
		t.Fatalf("after b's summary a keeps %v, want its own endpoint and %s, which holds the prompt", got, peer)
	}
	a.fc.headroom.put("a4", storedDecision{decision: flowcontrol.Decision{Outcome: flowcontrol.Dispatched,
		Band: flowcontrol.Sheddable, Endpoints: own}})
	if got := names(a.filter.Filter(context.Background(), fwksched.NewCycleState(), request("a4"), all)); !slices.Equal(got, own) {
		t.Fatalf("a keeps %v for a Sheddable request, want %v", got, own)
	}

	a.fc.PreRequest(context.Background(), request("a3"), &fwksched.SchedulingResult{PrimaryProfileName: "default",
		ProfileResults: map[string]*fwksched.ProfileRunResult{"default": {TargetEndpoints: []fwksched.Endpoint{sched[peer]}}}})
	if s := a.fc.PeerSummary(); !slices.Equal(s.Sent, []replication.EndpointCount{{Endpoint: peer, N: 1}}) {
		t.Fatalf("a's summary tells of %v on peers' endpoints, want a3 on %s", s.Sent, peer)
	}
	a.fc.ResponseBody(context.Background(), request("a3"), &fwkrc.Response{EndOfStream: true}, nil)
	if s := a.fc.PeerSummary(); len(s.Sent) != 0 {
		t.Fatalf("a3 ended, a's summary still tells of %v", s.Sent)
	}

	// a sent one request to b's endpoint, for prefix affinity, and no prefix block (its scheduler routed nothing
	// through a's prefix index here); b's summaries carried the blocks of the prompt it routed, and dropped none.
	want := `
# HELP sluice_peer_requests_sent_total Requests this replica sent to endpoints its peers own, by reason: idle_seat (a Critical request that would have waited here took an idle seat a peer offered), spare_place (a waiting request of a lower band took a place a peer would have left idle), prefix_affinity (the peer's endpoint held much more of the prompt) or adapter_affinity (the peer's endpoint held the request's LoRA adapter, and none of this replica's candidates did).
# TYPE sluice_peer_requests_sent_total counter
sluice_peer_requests_sent_total{reason="adapter_affinity"} 0
sluice_peer_requests_sent_total{reason="idle_seat"} 0
sluice_peer_requests_sent_total{reason="prefix_affinity"} 1
sluice_peer_requests_sent_total{reason="spare_place"} 0
`
	if err := testutil.CollectAndCompare(peerCollector{a.fc}, strings.NewReader(want), "sluice_peer_requests_sent_total"); err != nil {
		t.Fatal(err)
	}
	if sent, dropped := b.fc.prefixBlocks.sent.Load(), b.fc.prefixBlocks.dropped.Load(); sent == 0 || dropped != 0 {
		t.Fatalf("b's summaries carried %d prefix blocks and dropped %d, want some and none", sent, dropped)
	}
	if n := testutil.CollectAndCount(peerCollector{b.fc}, "sluice_peer_prefix_blocks_total"); n != 2 {
		t.Fatalf("%d series of prefix blocks, want sent and dropped", n)
	}
}

// TestFlowControlAdapterAffinityAcrossOwners: with the peer exchange, a replica's headroom filter keeps a peer's
// endpoint that holds the request's LoRA adapter when none of its own candidates does, so that a hot adapter is not
// loaded once per replica; a request the scheduler places there counts as sent for adapter affinity.
func TestFlowControlAdapterAffinityAcrossOwners(t *testing.T) {
	clk := clocktesting.NewFakeClock(fcT0)
	pool := &fakePool{}
	pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()), upstreamEndpoint("10.0.0.2", 0, 0, clk.Now()))
	peers := []string{"epp-a:9003", "epp-b:9003"}
	filter := mustHeadroomFilter(t)
	a := peerReplicaWith(t, clk, pool, flowcontrol.DefaultConfig(), peers, peers[0], map[string]fwkplugin.Plugin{"headroom": filter})
	b := peerReplica(t, clk, pool, flowcontrol.DefaultConfig(), peers, peers[1], true)
	sendSummary(t, a, b)
	sendSummary(t, b, a)
	if err := a.Admit(context.Background(), requestContext("probe", "t", 10, nil), 0); err != nil {
		t.Fatal(err)
	}
	sd, _ := a.headroom.get("probe")
	if len(sd.decision.Endpoints) != 1 {
		t.Fatalf("a admits on %v, want its own endpoint alone", sd.decision.Endpoints)
	}
	own, peer := sd.decision.Endpoints[0], "10.0.0.1:8000"
	if own == peer {
		peer = "10.0.0.2:8000"
	}
	// endpoint is a scheduling candidate at addr with the given requests running and waiting and adapters running; a
	// nil metrics slice of adapters means no metrics at all.
	endpoint := func(addr string, running, waiting int, adapters ...string) fwksched.Endpoint {
		m := fwkdl.NewMetrics()
		m.RunningRequestsSize, m.WaitingQueueSize, m.MaxActiveModels = running, waiting, 4
		for _, ad := range adapters {
			m.ActiveModels[ad] = 0
		}
		host, _, _ := strings.Cut(addr, ":")
		return fwksched.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: k8stypes.NamespacedName{Namespace: "default", Name: host},
			Address: host, Port: "8000"}, m, fwkdl.NewAttributes())
	}
	servingBase := func(ep fwksched.Endpoint, model string) fwksched.Endpoint {
		ep.Put(LoRAResidencyKey, &LoRAResidency{BaseModels: map[string]struct{}{model: {}}})
		return ep
	}
	noMetrics := func(addr string) fwksched.Endpoint {
		host, _, _ := strings.Cut(addr, ":")
		return fwksched.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: k8stypes.NamespacedName{Namespace: "default", Name: host},
			Address: host, Port: "8000"}, nil, fwkdl.NewAttributes())
	}
	tests := []struct {
		name         string
		band         flowcontrol.Band
		model        string
		own, peer    fwksched.Endpoint
		wantPeerKept bool
	}{
		{name: "the peer's endpoint alone holds the adapter", band: flowcontrol.Standard, model: "sql-lora",
			own: endpoint(own, 0, 0), peer: endpoint(peer, 0, 0, "sql-lora"), wantPeerKept: true},
		{name: "Critical likewise", band: flowcontrol.Critical, model: "sql-lora",
			own: endpoint(own, 0, 0), peer: endpoint(peer, 0, 0, "sql-lora"), wantPeerKept: true},
		{name: "an own candidate holds it too", band: flowcontrol.Standard, model: "sql-lora",
			own: endpoint(own, 0, 0, "sql-lora"), peer: endpoint(peer, 0, 0, "sql-lora")},
		{name: "the peer's endpoint runs as many as the own", band: flowcontrol.Standard, model: "sql-lora",
			own: endpoint(own, 3, 0), peer: endpoint(peer, 3, 0, "sql-lora"), wantPeerKept: true},
		{name: "the peer's endpoint runs more than the own", band: flowcontrol.Standard, model: "sql-lora",
			own: endpoint(own, 3, 0), peer: endpoint(peer, 4, 0, "sql-lora")},
		{name: "the peer's endpoint has a queue", band: flowcontrol.Standard, model: "sql-lora",
			own: endpoint(own, 3, 0), peer: endpoint(peer, 0, 1, "sql-lora")},
		{name: "the peer's endpoint reports no metrics", band: flowcontrol.Standard, model: "sql-lora",
			own: endpoint(own, 0, 0), peer: noMetrics(peer)},
		{name: "Sheddable keeps to its headroom", band: flowcontrol.Sheddable, model: "sql-lora",
			own: endpoint(own, 0, 0), peer: endpoint(peer, 0, 0, "sql-lora")},
		{name: "the peer holds another adapter", band: flowcontrol.Standard, model: "sql-lora",
			own: endpoint(own, 0, 0), peer: endpoint(peer, 0, 0, "chat-lora")},
		{name: "the model is one the peer serves as its base", band: flowcontrol.Standard, model: "sql-lora",
			own: endpoint(own, 0, 0), peer: servingBase(endpoint(peer, 0, 0, "sql-lora"), "sql-lora")},
		{name: "no adapter asked", band: flowcontrol.Standard,
			own: endpoint(own, 0, 0), peer: endpoint(peer, 0, 0, "")},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := fmt.Sprintf("r%d", i)
			a.headroom.put(id, storedDecision{decision: flowcontrol.Decision{Outcome: flowcontrol.Dispatched, Band: tt.band,
				Endpoints: []string{own}}})
			req := &fwksched.LLMRequest{RequestId: id, TargetModel: tt.model}
			want := []string{own}
			if tt.wantPeerKept {
				want = append(want, peer)
			}
			if got := names(filter.Filter(context.Background(), fwksched.NewCycleState(), req, []fwksched.Endpoint{tt.own, tt.peer})); !slices.Equal(got, want) {
				t.Errorf("a keeps %v, want %v", got, want)
			}
		})
	}

	// A placement on the peer's endpoint counts as adapter affinity only when the filter kept that endpoint for the
	// request's adapter; one it kept otherwise (here: no filter ran, as for prefix affinity) counts as prefix affinity,
	// though the endpoint holds the adapter too.
	place := func(id string, filtered bool) {
		t.Helper()
		a.headroom.put(id, storedDecision{decision: flowcontrol.Decision{Outcome: flowcontrol.Dispatched,
			Band: flowcontrol.Standard, Endpoints: []string{own}}})
		req := &fwksched.LLMRequest{RequestId: id, TargetModel: "sql-lora"}
		there := endpoint(peer, 0, 0, "sql-lora")
		if filtered {
			if got := names(filter.Filter(context.Background(), fwksched.NewCycleState(), req, []fwksched.Endpoint{endpoint(own, 0, 0), there})); len(got) != 2 {
				t.Fatalf("a keeps %v for %s, want its own endpoint and %s", got, id, peer)
			}
		}
		a.PreRequest(context.Background(), req, &fwksched.SchedulingResult{PrimaryProfileName: "default",
			ProfileResults: map[string]*fwksched.ProfileRunResult{"default": {TargetEndpoints: []fwksched.Endpoint{there}}}})
	}
	place("for-adapter", true)
	place("for-prefix", false)
	if got := a.peers.Counts(); got != (replication.Counts{AdapterAffinity: 1, PrefixAffinity: 1}) {
		t.Errorf("a counts %+v sent to peers' endpoints, want one for adapter affinity and one for prefix affinity", got)
	}
}

// sendSummary hands from's next peer summary, through its wire form, to to.
func sendSummary(t *testing.T, from, to *FlowControl) {
	t.Helper()
	wire, err := from.PeerSummary().AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := replication.ParseSummary(wire)
	if err != nil {
		t.Fatal(err)
	}
	to.HearPeer(s)
}

// TestFlowControlPeerDemand: every DemandEvery-th summary, the first included, carries what the replica's tenants ask
// (flowcontrol.Controller.Demand), in the wire form, and whether an endpoint of the replica is not seat-bound; the
// others carry none, and the receiver keeps the last one heard.
func TestFlowControlPeerDemand(t *testing.T) {
	clk := clocktesting.NewFakeClock(fcT0)
	pool := &fakePool{}
	pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()))
	view, err := replication.NewView("epp-a:9003", []string{"epp-a:9003", "epp-b:9003"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewFlowControl(flowcontrol.DefaultConfig(), FlowControlOptions{}, FlowControlDeps{Endpoints: pool,
		Clock: clk, Rand: rand.New(rand.NewPCG(1, 2)), Ownership: view, Peers: replication.NewExchange("epp-a:9003", time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SyncEndpoints(); err != nil {
		t.Fatal(err)
	}
	for i, tenant := range []string{"heavy", "heavy", "light"} {
		a.Submit(requestContext(fmt.Sprint("r", i), tenant, 10, nil), 0, func(error, bool) {})
		clk.Step(10 * time.Millisecond)
	}
	for i := range 2*DemandEvery + 1 {
		wire, err := a.PeerSummary().AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := replication.ParseSummary(wire)
		if err != nil {
			t.Fatal(err)
		}
		if carries := i%DemandEvery == 0; (s.Demand != nil) != carries {
			t.Fatalf("summary %d carries demand %+v, want %v", i+1, s.Demand, carries)
		}
		if s.Demand == nil {
			continue
		}
		if !s.Demand.Unseated { // its one endpoint has room: it was never full, so it is not seat-bound
			t.Fatalf("summary %d: demand not unseated with an endpoint that is not seat-bound", i+1)
		}
		var tenants []string
		for _, td := range s.Demand.Tenants {
			tenants = append(tenants, td.Tenant)
		}
		slices.Sort(tenants)
		if want := []string{"heavy", "light"}; !slices.Equal(tenants, want) {
			t.Fatalf("summary %d lists tenants %v, want %v", i+1, tenants, want)
		}
	}
}

// TestFlowControlPeerPoolRunning: a summary tells the most any of the replica's endpoints was seen running (from its
// scrapes), through the wire form, and a replica hearing it lists as idle, for its peers, the places up to that count on
// its own endpoint that has not queued yet (no slot limit is learned anywhere).
func TestFlowControlPeerPoolRunning(t *testing.T) {
	clk := clocktesting.NewFakeClock(fcT0)
	replica := func(self, peer, address string, running int) *FlowControl {
		pool := &fakePool{}
		e := upstreamEndpoint(address, 0, 0, clk.Now())
		e.GetMetrics().RunningRequestsSize = running
		pool.set(e)
		view, err := replication.NewView(self, []string{self, peer}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		fc, err := NewFlowControl(flowcontrol.DefaultConfig(), FlowControlOptions{}, FlowControlDeps{Endpoints: pool,
			Clock: clk, Rand: rand.New(rand.NewPCG(1, 2)), Ownership: view, Peers: replication.NewExchange(self, time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if err := fc.SyncEndpoints(); err != nil {
			t.Fatal(err)
		}
		return fc
	}
	a := replica("epp-a:9003", "epp-b:9003", "10.0.0.1", 4)
	b := replica("epp-b:9003", "epp-a:9003", "10.0.0.2", 1)
	sendSummary(t, a, b)
	sendSummary(t, b, a)
	if s := a.PeerSummary(); s.PoolRunning != 4 {
		t.Fatalf("a's summary tells the most run %d, want 4", s.PoolRunning)
	}
	sendSummary(t, a, b)
	if s := b.ctrl.SeatSummary(); !slices.Equal(s.Idle, []flowcontrol.EndpointSeats{{Endpoint: "10.0.0.2:8000", Seats: 4}}) {
		t.Fatalf("b lists idle %v, want its endpoint's 4 places (the pool ran 4, b's endpoint holds none of b's)", s.Idle)
	}
}

// TestFlowControlPeerSparePlaces: two replicas owning one endpoint each. A Standard request that waits at a (its
// endpoint's one slot taken) goes, once it has waited flowcontrol.SpareMinWait, on hearing b's summary, to the place b
// offers on its endpoint, where nothing waits
// (flowcontrol.Controller.DispatchSpareElsewhere); b then counts it there, so its own request waits until it ends.
// Without a headroom filter (nothing would schedule it on b's endpoint) it is not sent.
func TestFlowControlPeerSparePlaces(t *testing.T) {
	for _, steer := range []bool{true, false} {
		t.Run(fmt.Sprintf("steer=%v", steer), func(t *testing.T) {
			clk, pool, a, b := twoPeerReplicas(t, steer)
			type outcome struct {
				done      bool
				err       error
				endpoints []string
			}
			submit := func(fc *FlowControl, id string) *outcome {
				o := &outcome{}
				fc.Submit(requestContext(id, "t", 10, nil), 0, func(err error, _ bool) {
					o.done, o.err = true, err
					sd, _ := fc.headroom.get(id)
					o.endpoints = sd.decision.Endpoints
				})
				return o
			}
			sendSummary(t, a, b)
			if mine := submit(a, "a-s1"); !mine.done || mine.err != nil {
				t.Fatalf("a's first request: %+v, want it dispatched to a's endpoint", mine)
			}
			moved := submit(a, "a-s2")
			if moved.done {
				t.Fatalf("a's second request %+v did not wait for a place", moved)
			}
			// a-s2 waits flowcontrol.SpareMinWait (scraped again meanwhile); b has nothing waiting: it offers its
			// endpoint's place.
			clk.Step(flowcontrol.SpareMinWait)
			pool.set(refreshed(pool.PodList(allEndpoints), clk.Now())...)
			for _, fc := range []*FlowControl{a, b} {
				if err := fc.SyncEndpoints(); err != nil {
					t.Fatal(err)
				}
			}
			sendSummary(t, b, a)
			if !steer {
				if moved.done {
					t.Fatalf("a's second request %+v went to b's endpoint with nothing to schedule it there", moved)
				}
				return
			}
			if !moved.done || moved.err != nil || !slices.Equal(moved.endpoints, []string{"10.0.0.2:8000"}) {
				t.Fatalf("a's second request: %+v, want it sent to b's endpoint 10.0.0.2:8000", moved)
			}
			sendSummary(t, a, b) // b learns of a-s2 on its endpoint
			waiting := submit(b, "b-s1")
			if waiting.done {
				t.Fatalf("b's request %+v was dispatched onto the place a's request holds", waiting)
			}
			a.ResponseBody(context.Background(), &fwksched.LLMRequest{RequestId: "a-s2"}, &fwkrc.Response{EndOfStream: true}, nil)
			sendSummary(t, a, b) // b learns that it ended
			if !waiting.done || waiting.err != nil {
				t.Fatalf("b's request %+v, want it dispatched once a's request ended", waiting)
			}
			if n := a.peers.Counts(); n.SparePlace != 1 {
				t.Fatalf("a counts %+v, want one request sent to a spare place", n)
			}
		})
	}
}
