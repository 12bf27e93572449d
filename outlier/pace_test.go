package outlier

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"
)

// paceStep is one event at ms: a chunk of stream id from endpoint ep; the dispatch of request id to ep with a
// prompt of tokens (tokens > 0), for an adapter it may load there (loads); the end of stream id (end); a scrape of ep
// taken at takenMs showing inFlight requests there (scrape); a Stalled check (stall), want naming the endpoints it
// ejects; or a pick among a, b and c (pick), want naming those left out.
type paceStep struct {
	ms                int
	id, ep            string
	tokens            int
	loads             bool
	end               bool
	scrape            bool
	inFlight, takenMs int
	stall             bool
	pick              bool
	want              []string
}

// stream returns the chunks of stream id from ep: the first at start, then one after each gap (ms).
func streamOf(id, ep string, start int, gaps ...int) []paceStep {
	steps := []paceStep{{ms: start, id: id, ep: ep}}
	for _, g := range gaps {
		start += g
		steps = append(steps, paceStep{ms: start, id: id, ep: ep})
	}
	return steps
}

// repeat returns n copies of gap.
func repeat(n, gap int) []int { return slices.Repeat([]int{gap}, n) }

// paced merges the events in time order (stable: a check listed after a chunk at the same ms sees it).
func paced(parts ...[]paceStep) []paceStep {
	var all []paceStep
	for _, p := range parts {
		all = append(all, p...)
	}
	slices.SortStableFunc(all, func(a, b paceStep) int { return cmp.Compare(a.ms, b.ms) })
	return all
}

func pick(ms int, want ...string) []paceStep { return []paceStep{{ms: ms, pick: true, want: want}} }
func end(ms int, id string) []paceStep       { return []paceStep{{ms: ms, id: id, end: true}} }

// dispatch is request id sent to ep at ms with a prompt of tokens.
func dispatch(ms int, id, ep string, tokens int) []paceStep {
	return []paceStep{{ms: ms, id: id, ep: ep, tokens: tokens}}
}

// dispatchLoading is request id sent to ep at ms with a prompt of tokens, for a LoRA adapter ep may have to load.
func dispatchLoading(ms int, id, ep string, tokens int) []paceStep {
	return []paceStep{{ms: ms, id: id, ep: ep, tokens: tokens, loads: true}}
}

// prefilling is a prompt sent to ep at ms so long that its prefill may last past the row's end: it explains every
// stall of ep, so that only a stream's slow gaps judge it.
func prefilling(ep string, ms int) []paceStep { return dispatch(ms, "long-"+ep, ep, 1<<20) }

// dispatches is n requests sent to ep, one every every ms from ms, with a prompt of tokens each.
func dispatches(ep string, ms, every, n, tokens int) []paceStep {
	var steps []paceStep
	for i := range n {
		steps = append(steps, dispatch(ms+i*every, fmt.Sprintf("q%d-%s", i, ep), ep, tokens)...)
	}
	return steps
}

// scrape is ep's scrape taken at takenMs, showing inFlight requests there, seen at ms.
func scrape(ms int, ep string, inFlight, takenMs int) []paceStep {
	return []paceStep{{ms: ms, ep: ep, scrape: true, inFlight: inFlight, takenMs: takenMs}}
}

func stall(ms int, want ...string) []paceStep { return []paceStep{{ms: ms, stall: true, want: want}} }

var paceConfig = Config{Consecutive5xx: 5, BaseEjectionTime: time.Second, MaxEjectionTime: 3 * time.Second,
	MaxEjectionPercent: 50, SlowFactor: 4, SlowGaps: 3, EjectOnStall: true}

// warm is a warm-up of ep's pace: a stream of paceWarmup+8 gaps of gap ms from 0, ended at its last chunk.
func warm(ep string, gap int) []paceStep {
	return append(streamOf("warm-"+ep, ep, 0, repeat(paceWarmup+8, gap)...), end((paceWarmup+8)*gap, "warm-"+ep)...)
}

// Warm-ups end at 40 gaps of 20 ms: 800 ms. The chaos fleet's a10g-like server steps 18-35 ms, 180-350 ms slowed 10x.
func TestPace(t *testing.T) {
	tests := []struct {
		name  string
		steps []paceStep
	}{
		{name: "nothing is judged before the warm-up", steps: paced(
			streamOf("s", "a", 0, 10, 10, 10, 200, 200, 200, 200), warm("b", 20), pick(1000),
		)},
		{name: "three slow gaps eject while a peer is normal", steps: paced(
			warm("a", 20), prefilling("a", 790), warm("b", 20), streamOf("b2", "b", 800, repeat(40, 20)...),
			streamOf("s", "a", 800, 200, 200, 200), pick(1200), pick(1400, "a"),
			pick(2399, "a"), pick(2400),
		)},
		// A large batch under load starts a prefill or two in most steps: every stream's gaps are long, by the
		// prompts sent there (a 128-token prompt may take 2 usual gaps, 40 ms, at the slowest rate).
		{name: "prompts sent there explain a busy batch's long gaps", steps: paced(
			warm("a", 20), prefilling("a", 790), warm("b", 20), streamOf("b2", "b", 800, repeat(60, 20)...),
			streamOf("s", "a", 800, repeat(8, 100)...), dispatches("a", 850, 100, 8, 128), pick(1650),
		)},
		{name: "prompts sent there explain a slowed server's gaps only for as long as their prefill", steps: paced(
			warm("a", 20), prefilling("a", 790), warm("b", 20), streamOf("b2", "b", 800, repeat(60, 20)...),
			streamOf("s", "a", 800, repeat(4, 200)...), dispatches("a", 850, 200, 4, 64), pick(1399), pick(1400, "a"),
		)},
		{name: "a long step now and then ejects nothing", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("b2", "b", 800, repeat(60, 20)...),
			streamOf("s", "a", 800, 200, 20, 20, 200, 20, 20, 200, 20, 20, 200), pick(2000),
		)},
		{name: "a delayed chunk does not reset the count", steps: paced(
			warm("a", 20), prefilling("a", 790), warm("b", 20), streamOf("b2", "b", 800, repeat(40, 20)...),
			streamOf("s", "a", 800, 200, 200, 10), pick(1211), // the second slow chunk came late, the next right after
			[]paceStep{{ms: 1409, id: "s", ep: "a"}}, pick(1409, "a"),
		)},
		{name: "slow gaps of different streams do not add up", steps: paced(
			warm("a", 20), prefilling("a", 790), warm("b", 20), streamOf("b2", "b", 800, repeat(60, 20)...),
			streamOf("s1", "a", 800, 200, 200), streamOf("s2", "a", 810, 200, 200), streamOf("s3", "a", 820, 200, 200), pick(1300),
		)},
		{name: "the whole pool slowing down ejects nothing", steps: paced(
			warm("a", 20), warm("b", 20),
			streamOf("s", "a", 800, 200, 200, 200, 200), streamOf("t", "b", 800, 200, 200, 200, 200), pick(1700),
		)},
		{name: "a slower GPU is judged by its own pace", steps: paced(
			warm("h100", 6), warm("a10g", 20), streamOf("a10g-2", "a10g", 800, repeat(100, 20)...),
			streamOf("h", "h100", 240, repeat(300, 6)...), end(2040, "h"), pick(2100),
			streamOf("slowed", "a10g", 2100, 200, 200, 200), pick(2700, "a10g"),
		)},
		{name: "a stall ejects before its chunk", steps: paced(
			warm("a", 20), prefilling("a", 790), warm("b", 20), streamOf("b2", "b", 800, repeat(40, 20)...),
			streamOf("s", "a", 800, 200, 200), stall(1279), pick(1279), stall(1280, "a"), pick(1280, "a"),
			stall(1281), // one ejection, reported once
		)},
		{name: "an ended stream does not stall", steps: paced(
			warm("a", 20), prefilling("a", 790), warm("b", 20), streamOf("b2", "b", 800, repeat(40, 20)...),
			streamOf("s", "a", 800, 200, 200), []paceStep{{ms: 1201, id: "s", end: true}}, stall(1300), pick(1300),
		)},
		{name: "still slow after the ejection: ejected again, for longer; a normal pace starts over", steps: paced(
			warm("a", 20), prefilling("a", 790), warm("b", 20), streamOf("b2", "b", 800, repeat(480, 20)...),
			streamOf("s", "a", 800, repeat(12, 200)...), // ejected at 1400, for 1 s; again at 2400 for 2 s
			pick(2399, "a"), pick(2400, "a"), pick(4399, "a"),
			// On probation, two normal gaps do not start over, and one slow gap ejects again (the 3rd in a row: 3 s).
			streamOf("t", "a", 4400, 20, 20, 200), pick(4639), pick(4640, "a"), pick(7639, "a"), pick(7640),
			// A window of normal gaps ends the probation: slow again, it takes three slow gaps, for a first ejection.
			streamOf("u", "a", 7640, 20, 20, 20, 20, 20, 200, 200), pick(8140),
			[]paceStep{{ms: 8340, id: "u", ep: "a"}}, pick(8340, "a"), pick(9339, "a"), pick(9340),
		)},
		{name: "all of an endpoint's streams stalled with no prefill sent there: ejected at once", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("b2", "b", 800, repeat(40, 20)...),
			streamOf("s", "a", 800, 200), streamOf("t", "a", 810, 200), stall(889), pick(889), stall(890, "a"), pick(890, "a"),
		)},
		// Prefill at the slowest rate: 64 tokens per usual gap (20 ms), stall at 4 usual gaps (80 ms).
		{name: "a long prompt sent there explains its stall for as long as its prefill may take", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("b2", "b", 800, repeat(40, 20)...),
			streamOf("s", "a", 800), dispatch(850, "p", "a", 1000), stall(999), stall(1242), stall(1243, "a"),
		)},
		{name: "a short prompt delays the stall by its prefill only", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("b2", "b", 800, repeat(40, 20)...),
			streamOf("s", "a", 800), dispatch(850, "q", "a", 64), stall(880), stall(949), stall(950, "a"),
		)},
		// An adapter load: 4 usual gaps (80 ms) more than its prompt's prefill (20 ms).
		{name: "an adapter load sent there explains its stall with its prompt's prefill", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("b2", "b", 800, repeat(40, 20)...),
			streamOf("s", "a", 800), dispatchLoading(850, "q", "a", 64), stall(950), stall(1029), stall(1030, "a"),
		)},
		// lora-heavy with every chunk reported (usual gap 6 ms, 289-token prompts): two requests sent during steps
		// that each load an adapter (42 ms steps); the second one's prefill starts when the first one's step ends,
		// at 346 ms, 18 ms after the first one's prefill alone explains.
		{name: "adapter loads of requests sent during a load's step explain its stall", steps: paced(
			warm("a", 6), warm("b", 6), streamOf("b2", "b", 300, repeat(50, 6)...),
			streamOf("s", "a", 240, repeat(10, 6)...), dispatchLoading(301, "q1", "a", 289), dispatchLoading(311, "q2", "a", 289),
			streamOf("q1", "a", 346, 42), []paceStep{{ms: 346, id: "s", ep: "a"}, {ms: 388, id: "s", ep: "a"}},
			stall(387), pick(388),
		)},
		{name: "adapter loads explain a slowed server's stall only for as long as they take", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("b2", "b", 800, repeat(40, 20)...),
			streamOf("s", "a", 800), dispatchLoading(810, "q1", "a", 64), dispatchLoading(820, "q2", "a", 64),
			stall(1089), stall(1090, "a"),
		)},
		{name: "the prefills of a burst add up", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("b2", "b", 800, repeat(40, 20)...),
			streamOf("s", "a", 800), dispatch(850, "q1", "a", 64), dispatch(850, "q2", "a", 64),
			dispatch(851, "q3", "a", 64), stall(989), stall(990, "a"),
		)},
		{name: "an end lets the oldest waiting request start its prefill", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("b2", "b", 800, repeat(40, 20)...),
			streamOf("s", "a", 800, 20, 20), streamOf("t", "a", 800, 20, 20), dispatch(805, "q", "a", 640),
			end(841, "s"), stall(1284), stall(1285, "a"), // without the end: at 1085
		)},
		{name: "the whole pool stalling together ejects nothing", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("s", "a", 800, 200), streamOf("t", "b", 800, 200), stall(880), stall(999),
		)},
		// A starved host: the EPP, the proxy and the servers pause together, and the chunks held back arrive in a
		// burst, in any order. b was quiet (60 ms: 3 usual gaps, not slow) over most of a's silence.
		{name: "a pause the pool shared ejects nothing, a peer's chunks delivered first", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("s", "a", 800, 20, 20, 20, 20), streamOf("t", "b", 810, 20, 20, 20, 20, 60, 1, 1),
			stall(965), pick(965),
		)},
		{name: "a pause the pool shared ejects nothing, its chunk delivered first", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("s", "a", 800, 20, 20, 20, 20, 85), streamOf("t", "b", 810, 20, 20, 20, 20, 76, 1),
			pick(967),
		)},
		{name: "a peer's quiet spell before the silence does not explain it", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("s", "a", 800, 20, 20, 20, 20, 20), streamOf("t", "b", 800, append([]int{20, 20, 60}, repeat(10, 20)...)...),
			stall(979), stall(980, "a"),
		)},
		{name: "a slower GPU's silence is judged by its own pace", steps: paced(
			warm("h100", 6), warm("a10g", 20), streamOf("h", "h100", 240, repeat(200, 6)...),
			streamOf("g", "a10g", 800, 60, 60, 60), stall(859), stall(919), stall(979),
		)},
		{name: "a stream whose end was lost stalls nothing past the stall horizon", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("b2", "b", 800, repeat(120, 20)...),
			streamOf("s", "a", 800), stall(2801),
		)},
		{name: "a server growing busier is learnt", steps: paced(
			warm("a", 20), warm("b", 20), streamOf("b2", "b", 800, repeat(300, 20)...),
			streamOf("s", "a", 800, growing(20, 80, 200)...), pick(7000),
		)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runDefaultPace(t, tt.steps)
		})
	}
}

// TestPaceStallRuleOff: with the stall rule off, configured (EjectOnStall) or turned off later (SetEjectOnStall, as
// an EPP with peers does), a server whose streams all stall is left to its streams' slow gaps.
func TestPaceStallRuleOff(t *testing.T) {
	for _, tt := range []struct {
		name            string
		configured, set bool
	}{
		{name: "configured off", configured: false, set: false},
		{name: "turned off", configured: true, set: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := paceConfig
			cfg.EjectOnStall = tt.configured
			d, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			p := NewPace(d)
			if tt.set {
				p.SetEjectOnStall(false)
			}
			runPace(t, d, p, paced(
				warm("a", 20), warm("b", 20), streamOf("b2", "b", 800, repeat(40, 20)...),
				streamOf("s", "a", 800, 200), streamOf("t", "a", 810, 200), stall(890), pick(890), pick(1100),
			))
		})
	}
}

// TestPaceOthersRequests: requests an endpoint's scrape shows beyond those this EPP has there (a peer replica's,
// whose prompts it never sees) explain its streams' silence as prompts of the mean length dispatched, once per
// scrape; not a stream's slow gaps. The mean prompt is 256 tokens (4 usual gaps of 20 ms at 64 a gap).
func TestPaceOthersRequests(t *testing.T) {
	// a streams s and t from 800 and 810 ms, and falls silent; b streams at its pace.
	fleet := func(steps ...[]paceStep) []paceStep {
		return paced(append(steps, warm("a", 20), warm("b", 20), streamOf("b2", "b", 800, repeat(40, 20)...),
			dispatch(700, "q", "b", 256), streamOf("s", "a", 800), streamOf("t", "a", 810))...)
	}
	tests := []struct {
		name  string
		steps []paceStep
	}{
		{name: "no scrape: the silence is a stall", steps: fleet(stall(889), stall(890, "a"))},
		{name: "only this EPP's requests there: a stall", steps: fleet(scrape(850, "a", 2, 850), stall(890, "a"))},
		// 2 others' prompts at 850: 512 tokens, 8 usual gaps (160 ms), to 1010; 4 usual gaps more is a stall.
		{name: "others' requests explain a stall", steps: fleet(
			scrape(850, "a", 4, 850), stall(890), stall(1089), stall(1090, "a"),
		)},
		{name: "the same scrape counts once", steps: fleet(
			scrape(850, "a", 4, 850), scrape(1000, "a", 4, 850), stall(1090, "a"),
		)},
		// At 1000 (scrape of 950) 2 more: to 1170.
		{name: "each new scrape counts them again", steps: fleet(
			scrape(850, "a", 4, 850), scrape(1000, "a", 4, 950), stall(1090), stall(1249), stall(1250, "a"),
		)},
		{name: "others' requests do not explain a stream's slow gaps", steps: fleet(
			streamOf("s", "a", 1000, 200, 200), scrape(850, "a", 12, 850), scrape(1050, "a", 12, 1050),
			scrape(1250, "a", 12, 1250), stall(1190), pick(1200), pick(1399), pick(1400, "a"),
		)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runDefaultPace(t, tt.steps)
		})
	}
}

// growing returns n gaps growing evenly from from to to ms.
func growing(from, to, n int) []int {
	gaps := make([]int, n)
	for i := range gaps {
		gaps[i] = from + (to-from)*i/(n-1)
	}
	return gaps
}

// runDefaultPace runs steps on a Pace of a detector of paceConfig.
func runDefaultPace(t *testing.T, steps []paceStep) {
	t.Helper()
	d, err := New(paceConfig)
	if err != nil {
		t.Fatal(err)
	}
	runPace(t, d, NewPace(d), steps)
}

func runPace(t *testing.T, d *Detector, p *Pace, steps []paceStep) {
	t.Helper()
	abc := []string{"a", "b", "c", "h100", "a10g"}
	out := make([]bool, len(abc))
	for i, s := range steps {
		now := at(s.ms)
		switch {
		case s.pick:
			d.Eject(now, abc, out)
			var got []string
			for j, left := range out {
				if left {
					got = append(got, abc[j])
				}
			}
			if !slices.Equal(got, s.want) {
				t.Fatalf("step %d at %d ms: left out %v, want %v", i, s.ms, got, s.want)
			}
		case s.stall:
			var got []string
			for _, e := range p.Stalled(now) {
				got = append(got, e.Endpoint)
			}
			if !slices.Equal(got, s.want) {
				t.Fatalf("step %d at %d ms: stalls ejected %v, want %v", i, s.ms, got, s.want)
			}
		case s.end:
			p.End(now, s.id)
		case s.scrape:
			p.Scraped(now, s.ep, s.inFlight, at(s.takenMs))
		case s.tokens > 0:
			p.Dispatch(now, s.id, s.ep, s.tokens, s.loads)
		default:
			p.Chunk(now, s.id, s.ep)
		}
	}
}
