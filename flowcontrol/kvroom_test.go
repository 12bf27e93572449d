package flowcontrol

import (
	"math"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// A request of the kv-bound shape as the EPP estimates it: a 512-token prompt (552 from its body's bytes) and 128
// tokens of output, run for 3.6 s from its first chunk to its end.
var (
	kvReq = kvSize{prompt: 552, output: 128}
	kvRun = 3600 * time.Millisecond
)

func TestSizeOf(t *testing.T) {
	tests := []struct {
		name string
		req  Request
		want kvSize
	}{
		{"prompt and output", Request{EstimatedCost: 680, OutputTokens: 128}, kvSize{552, 128}},
		{"output unknown: all prompt", Request{EstimatedCost: 680}, kvSize{680, 0}},
		{"output beyond the cost is the cost", Request{EstimatedCost: 100, OutputTokens: 500}, kvSize{0, 100}},
		{"no cost counts as 1", Request{}, kvSize{1, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := sizeOf(tc.req); got != tc.want {
				t.Fatalf("sizeOf = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestKVSizeAt: a request holds its prompt until its first chunk and grows linearly into its output over its run.
func TestKVSizeAt(t *testing.T) {
	const started = int64(10e9)
	tests := []struct {
		name             string
		startedNs, nowNs int64
		run              time.Duration
		want             float64
	}{
		{"not started", 0, started, kvRun, 552},
		{"at its first chunk", started, started, kvRun, 552},
		{"half way", started, started + int64(kvRun/2), kvRun, 616},
		{"at its end", started, started + int64(kvRun), kvRun, 680},
		{"beyond its predicted end: no more than its final size", started, started + 2*int64(kvRun), kvRun, 680},
		{"no run time learned", started, started + int64(kvRun), 0, 552},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := kvReq.at(tc.startedNs, tc.nowNs, tc.run); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("at = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestLearnKVCapacity: a scrape teaches what the EPP's requests held over the KV use it shows, only when the EPP can
// account for everything the server holds.
func TestLearnKVCapacity(t *testing.T) {
	ten := kvScrape{started: 10, held: 6160}
	tests := []struct {
		name     string
		endpoint Endpoint
		foreign  int
		run      time.Duration
		before   float64
		scrape   kvScrape
		want     float64
	}{
		{name: "first scrape", endpoint: Endpoint{Running: 10, KVCacheUsage: 0.9625}, run: kvRun, scrape: ten, want: 6400},
		{name: "smoothed", endpoint: Endpoint{Running: 10, KVCacheUsage: 0.9625}, run: kvRun, before: 7400, scrape: ten,
			want: 7400 + kvCapacityWeight*(6400-7400)},
		{name: "an admitted prompt not started holds its prompt", endpoint: Endpoint{Running: 10, KVCacheUsage: 0.9625}, run: kvRun,
			scrape: kvScrape{started: 9, held: 6160 - 552, pending: 2, pendingPrompt: 2 * 552}, want: 6400},
		{name: "a started request preempted: nothing learned", endpoint: Endpoint{Running: 9, WaitingQueue: 1, KVCacheUsage: 0.9},
			run: kvRun, scrape: ten},
		{name: "more waiting than the EPP's prompts not started: nothing learned",
			endpoint: Endpoint{Running: 10, WaitingQueue: 2, KVCacheUsage: 0.9625}, run: kvRun, scrape: kvScrape{started: 10, held: 6160, pending: 1, pendingPrompt: 552}},
		{name: "foreign load: nothing learned", endpoint: Endpoint{Running: 10, KVCacheUsage: 0.9625}, foreign: 1, run: kvRun, scrape: ten},
		{name: "low KV use: nothing learned", endpoint: Endpoint{Running: 3, KVCacheUsage: 0.3}, run: kvRun,
			scrape: kvScrape{started: 3, held: 1800}},
		{name: "no run time learned: nothing learned", endpoint: Endpoint{Running: 10, KVCacheUsage: 0.9625}, scrape: ten},
		{name: "a KV use none of the EPP's requests hold: nothing learned", endpoint: Endpoint{KVCacheUsage: 0.8}, run: kvRun,
			before: 6800, scrape: kvScrape{}, want: 6800},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEndpointState(tc.endpoint)
			e.foreign, e.runTime, e.kvCapacity = tc.foreign, tc.run, tc.before
			e.learnKVCapacity(tc.scrape)
			if math.Abs(e.kvCapacity-tc.want) > 1e-6 {
				t.Fatalf("capacity %v, want %v", e.kvCapacity, tc.want)
			}
		})
	}
}

// TestMeanFinalSizeCapped: a request's size counts in the mean final size at most the KV capacity of the endpoint it
// went to; its output comes from the client's max_tokens.
func TestMeanFinalSizeCapped(t *testing.T) {
	tests := []struct {
		name     string
		size     kvSize
		capacity float64
		want     float64
	}{
		{name: "a request that fits", size: kvReq, capacity: 6800, want: kvReq.final()},
		{name: "max_tokens in the millions", size: kvSize{prompt: 512, output: 1 << 24}, capacity: 6800, want: 6800},
		{name: "capacity not learned", size: kvSize{prompt: 512, output: 1 << 24}, want: 512 + 1<<24},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c Controller
			c.noteKVSizeLocked(tc.size, tc.capacity)
			if c.kvMeanFinal != tc.want {
				t.Fatalf("mean final size %v, want %v", c.kvMeanFinal, tc.want)
			}
		})
	}
}

// TestFitsFinal: an unprotected request fits where every request there, itself included, fits at its final size, to
// the nearest request; an endpoint whose room is not known, or that holds none of the EPP's requests, always fits.
func TestFitsFinal(t *testing.T) {
	tests := []struct {
		name     string
		inflight int
		capacity float64
		foreign  int
		// peer requests of kvReq's size, of which peerUnsized are of peers that did not tell their sizes
		peer, peerUnsized int
		noSeats           bool
		final             float64 // the size judged; 0: kvReq's
		want              bool
	}{
		{name: "the tenth of ten", inflight: 9, capacity: 6800, want: true},
		{name: "the tenth, capacity learned a few percent low", inflight: 9, capacity: 6600, want: true},
		{name: "the eleventh of ten", inflight: 10, capacity: 6800},
		{name: "the tenth of nine and a half", inflight: 9, capacity: 6450},
		{name: "capacity not learned", inflight: 20, want: true},
		{name: "foreign load", inflight: 20, capacity: 6800, foreign: 1, want: true},
		{name: "no seats: a large-batch server", inflight: 20, capacity: 6800, noSeats: true, want: true},
		{name: "empty, a mean size beyond the capacity", capacity: 6800, final: 1 << 24, want: true},
		{name: "one there, a mean size beyond the capacity", inflight: 1, capacity: 6800, final: 1 << 24},
		{name: "the tenth with a peer's request: counted at its size", inflight: 8, peer: 1, foreign: 1, capacity: 6800, want: true},
		{name: "the eleventh with a peer's request", inflight: 9, peer: 1, foreign: 1, capacity: 6800},
		{name: "the eleventh, the peer's not scraped yet", inflight: 9, peer: 1, capacity: 6800},
		{name: "the eleventh, a peer's of unknown size", inflight: 9, peer: 1, peerUnsized: 1, foreign: 1, capacity: 6800, want: true},
		{name: "the eleventh, foreign load beyond the peers'", inflight: 9, peer: 1, foreign: 2, capacity: 6800, want: true},
		{name: "only a peer's requests there, the eleventh", peer: 10, foreign: 10, capacity: 6800},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEndpointState(Endpoint{})
			e.kvCapacity, e.runTime, e.foreign, e.seats = tc.capacity, kvRun, tc.foreign, 11
			if tc.noSeats {
				e.seats = 0
			}
			e.inflight, e.kvFinal = tc.inflight, float64(tc.inflight)*kvReq.final()
			e.peer, e.peerUnsized, e.peerKV = tc.peer, tc.peerUnsized, float64(tc.peer-tc.peerUnsized)*kvReq.final()
			final := kvReq.final()
			if tc.final > 0 {
				final = tc.final
			}
			if got := e.fitsFinal(final); got != tc.want {
				t.Fatalf("fitsFinal = %v, want %v", got, tc.want)
			}
		})
	}
}

// startedAgo lists n requests of kvReq that started ago[i] before now (0: not started).
func startedAgo(nowNs int64, ago ...time.Duration) []kvEntry {
	out := make([]kvEntry, len(ago))
	for i, a := range ago {
		out[i] = kvEntry{size: kvReq}
		if a > 0 {
			out[i].startedNs = nowNs - int64(a)
		}
	}
	return out
}

// TestKVStays: a request sent now keeps its blocks when, at no predicted end of a request there nor at its own end,
// the requests still there need more than the KV cache holds.
func TestKVStays(t *testing.T) {
	const nowNs = int64(100e9)
	s := time.Second
	nine := []time.Duration{3 * s, 3 * s, 3 * s, 3 * s, 3 * s, 3 * s, 3 * s, 3 * s, 3 * s}
	tests := []struct {
		name     string
		entries  []kvEntry
		capacity float64
		want     bool
	}{
		{name: "nine near their end: they free before it grows", entries: startedAgo(nowNs, nine...), capacity: 6800, want: true},
		{name: "ten near their end, room for a prompt now, none to grow: the cache fills before they end",
			entries: startedAgo(nowNs, append(nine, 3*s)...), capacity: 6800 + 60},
		{name: "nine just started: they grow into its blocks", entries: startedAgo(nowNs, 100*time.Millisecond, 100*time.Millisecond,
			100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond,
			100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond), capacity: 6800},
		{name: "an empty endpoint", capacity: 6800, want: true},
		{name: "prompts not started count from now", entries: startedAgo(nowNs, 0, 0, 0, 0, 0, 0, 0, 0, 0), capacity: 6800, want: true},
		{name: "ten past their predicted end are still there at their final size: no room for a prompt",
			entries: startedAgo(nowNs, 9*s, 9*s, 9*s, 9*s, 9*s, 9*s, 9*s, 9*s, 9*s, 9*s), capacity: 6800 + 60},
		{name: "nine past their predicted end, room for one more at its final size", entries: startedAgo(nowNs, 9*s, 9*s, 9*s,
			9*s, 9*s, 9*s, 9*s, 9*s, 9*s), capacity: 6800, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := kvStays(tc.entries, kvReq, tc.capacity, nowNs, kvRun); got != tc.want {
				t.Fatalf("kvStays = %v, want %v", got, tc.want)
			}
		})
	}
}

// wantPlaced checks where kvPlaceLocked sends a request of kvReq of tenant "t" in band among a, b and c (best the
// first), at now, with the harness's lock held: among want, and its best one of them.
func wantPlaced(t *testing.T, h *harness, band Band, now time.Time, want []string) {
	t.Helper()
	best, got := h.c.kvPlaceLocked(band, "t", kvReq, 0, []string{"a", "b", "c"}, now)
	if !slices.Equal(got, want) {
		t.Fatalf("placed among %v, want %v", got, want)
	}
	if name := h.c.endpoints[best].Name; !slices.Contains(got, name) {
		t.Fatalf("best %s is not among %v", name, got)
	}
}

// kvHarness returns a harness whose endpoints a, b and c each carry running requests of kvReq (started ago) with KV
// room learned: capacity 6800 tokens (ten requests at their final size), run time kvRun. The caller holds no lock.
func kvHarness(t *testing.T, ago map[string][]time.Duration) *harness {
	t.Helper()
	return kvHarnessConfig(t, nil, ago)
}

// kvHarnessConfig is kvHarness with the test configuration changed by configure.
func kvHarnessConfig(t *testing.T, configure func(*Config), ago map[string][]time.Duration) *harness {
	t.Helper()
	h := newHarness(t, testConfig(t, configure))
	h.scrape(ep("a", 0), ep("b", 0), ep("c", 0))
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	now := h.clk.Now()
	n := 0
	for _, name := range []string{"a", "b", "c"} {
		i := h.c.endpointIndex[name]
		e := &h.c.endpoints[i]
		e.kvCapacity, e.runTime = 6800, kvRun
		e.learner.queued, e.learner.maxRunning = true, 11 // tentative seats: a small server that queued
		for _, a := range ago[name] {
			n++
			id := name + string(rune('0'+n))
			h.c.reserveLocked(id, true, kvReq, i, now)
			r := h.c.reservations[id]
			if a > 0 {
				e.tally(r, -1)
				r.pending, r.started, r.startedNs = false, true, now.UnixNano()-int64(a)
				e.tally(r, +1)
				h.c.reservations[id] = r
			}
		}
		e.refresh(h.c.cfg.Endpoint)
	}
	return h
}

func repeatAgo(n int, a time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = a
	}
	return out
}

// TestKVPlace: a protected request goes where its prompt fits now and it stays, else where it fits now, else where
// headroom alone put it; an unprotected one, or one among endpoints whose room is not known, is placed as before.
func TestKVPlace(t *testing.T) {
	s := time.Second
	full := repeatAgo(10, 3*s)   // ten near their end: 6,720 tokens held, no room for a prompt
	young := repeatAgo(10, s/10) // ten just started: room for a prompt now, but they grow into it
	roomy := repeatAgo(8, 2*s)   // eight at mid-run: room now and to stay
	tests := []struct {
		name     string
		band     Band
		critical bool // a Critical request arrived just now: the reserve is on
		ago      map[string][]time.Duration
		unknown  string // an endpoint whose capacity is not learned
		want     []string
	}{
		{name: "Critical: where it fits and stays", band: Critical, critical: true,
			ago: map[string][]time.Duration{"a": full, "b": young, "c": roomy}, want: []string{"c"}},
		{name: "Critical: where it fits now when it stays nowhere", band: Critical, critical: true,
			ago: map[string][]time.Duration{"a": full, "b": young, "c": full}, want: []string{"b"}},
		{name: "Critical: fits nowhere, placed as before", band: Critical, critical: true,
			ago: map[string][]time.Duration{"a": full, "b": full, "c": full}, want: []string{"a", "b", "c"}},
		{name: "Critical: an endpoint's room unknown, placed as before", band: Critical, critical: true,
			ago: map[string][]time.Duration{"a": full, "b": young, "c": roomy}, unknown: "a", want: []string{"a", "b", "c"}},
		{name: "Standard is not protected", band: Standard, critical: true,
			ago: map[string][]time.Duration{"a": full, "b": young, "c": roomy}, want: []string{"a", "b", "c"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := kvHarness(t, tc.ago)
				h.c.mu.Lock()
				defer h.c.mu.Unlock()
				now := h.clk.Now()
				if tc.critical {
					h.c.lastCritical = now
				}
				if tc.unknown != "" {
					h.c.endpoints[h.c.endpointIndex[tc.unknown]].kvCapacity = 0
				}
				wantPlaced(t, h, tc.band, now, tc.want)
			})
		})
	}
}

// TestKVKeepsRoom: under the Critical reserve, Standard and Sheddable keep to where they fit at their final size only
// while the pool is saturated, a request below Critical waiting in the EPP; Critical, every band without the
// reserve, and every band of a pool not saturated (nothing waits, or only Critical: the recovery phase after an
// overload) take the room the running requests will grow into.
func TestKVKeepsRoom(t *testing.T) {
	s := time.Second
	tests := []struct {
		name     string
		band     Band
		critical bool
		waiting  Band // the band of a request waiting in the EPP (NumBands: none)
		want     bool
	}{
		{name: "Standard under the reserve, Standard waits", band: Standard, critical: true, waiting: Standard},
		{name: "Sheddable under the reserve, Sheddable waits", band: Sheddable, critical: true, waiting: Sheddable},
		{name: "Standard under the reserve, nothing waits", band: Standard, critical: true, waiting: NumBands, want: true},
		{name: "Sheddable under the reserve, nothing waits", band: Sheddable, critical: true, waiting: NumBands, want: true},
		{name: "Standard under the reserve, only Critical waits", band: Standard, critical: true, waiting: Critical, want: true},
		{name: "Critical under the reserve, Standard waits", band: Critical, critical: true, waiting: Standard, want: true},
		{name: "Standard without the reserve, Standard waits", band: Standard, waiting: Standard, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// a holds ten at their final size: full for an unprotected request, though it has room for a prompt
				// now (they just started).
				h := kvHarness(t, map[string][]time.Duration{"a": repeatAgo(10, s/10)})
				h.c.mu.Lock()
				defer h.c.mu.Unlock()
				now := h.clk.Now()
				if tc.critical {
					h.c.lastCritical = now
				}
				if tc.waiting != NumBands {
					h.c.bands[tc.waiting].count++ // as a queued request counts (admitLocked), until the test ends
					h.c.totalCount++
					defer func() { h.c.bands[tc.waiting].count--; h.c.totalCount-- }()
				}
				e := &h.c.endpoints[h.c.endpointIndex["a"]]
				keep := h.c.kvKeepsRoomLocked(tc.band, "t", h.c.criticalReserveLocked(now), now)
				if got := h.c.kvTakesLocked(e, keep); got != tc.want {
					t.Fatalf("a takes it: %v, want %v", got, tc.want)
				}
				if got := h.c.kvTakesLocked(&h.c.endpoints[h.c.endpointIndex["b"]], keep); !got {
					t.Fatal("b, holding nothing, does not take it")
				}
			})
		})
	}
}

// TestLowerBandsSaturated steps arrivals that wait in the EPP (every endpoint above its ceiling) and withdrawals
// through the Controller: the pool counts as saturated while a request below Critical waits, Critical waiting alone
// does not count, and the last lower-band request to leave ends it.
func TestLowerBandsSaturated(t *testing.T) {
	type step struct {
		admit  int // priority of a request that arrives and waits (noArrival: none)
		cancel int // 1-based index of an arrival that gives up (0: none)
		want   bool
	}
	const noArrival = 99
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "a Standard request waits", steps: []step{{admit: 0, want: true}}},
		{name: "a Sheddable request waits", steps: []step{{admit: -1, want: true}}},
		{name: "Critical alone never", steps: []step{{admit: 1, want: false}, {admit: 1, want: false}}},
		{name: "the last to leave ends it", steps: []step{
			{admit: 0, want: true},
			{admit: 1, want: true},
			{admit: noArrival, cancel: 1, want: false},
		}},
		{name: "one of two leaving keeps it", steps: []step{
			{admit: 0, want: true},
			{admit: -1, cancel: 1, want: true},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, queueingSheddable))
				h.scrape(ep("a", 5), ep("b", 5)) // at the queue depth: above every band's ceiling
				var calls []*call
				for i, st := range tc.steps {
					if st.admit != noArrival {
						cl := h.admit(st.admit, "t", 100)
						cl.wantWaiting(t)
						calls = append(calls, cl)
					}
					if st.cancel > 0 {
						calls[st.cancel-1].cancel()
						synctest.Wait()
					}
					h.c.mu.Lock()
					got := h.c.lowerBandsSaturatedLocked()
					h.c.mu.Unlock()
					if got != st.want {
						t.Fatalf("step %d: saturated %v, want %v", i, got, st.want)
					}
				}
			})
		})
	}
}

// TestKVRoomWithLivePeers: with live peers (one of several replicas, each owning its endpoints) KV room is counted as
// alone, with the requests peers sent to this replica's endpoints at the final sizes they told (Peers.LoadKV): a
// protected request goes where its prompt fits now and stays, an unprotected one keeps to final sizes while a lower
// band waits; an endpoint holding a peer's request of unknown size (an older release's) is placed as before.
func TestKVRoomWithLivePeers(t *testing.T) {
	s := time.Second
	full := repeatAgo(10, 3*s)
	young := repeatAgo(10, s/10)
	roomy := repeatAgo(8, 2*s)
	tests := []struct {
		name        string
		band        Band
		peerOnC     int  // requests of kvReq's size a peer sent to c
		unsized     bool // ... of a peer that does not tell their sizes
		waiting     bool // a Standard request waits here
		wantPlaced  []string
		wantATakes  bool // a, ten just started, takes one more unprotected request at its final size
		wantCTakes  bool // c takes one
		checkTaking bool
	}{
		{name: "Critical: where it fits and stays", band: Critical, wantPlaced: []string{"c"}},
		{name: "Critical: a peer's requests on c leave no room there", band: Critical, peerOnC: 2, wantPlaced: []string{"b"}},
		{name: "Critical: a peer's requests of unknown size on c, placed as before", band: Critical, peerOnC: 2, unsized: true,
			wantPlaced: []string{"a", "b", "c"}},
		{name: "Standard keeps to final sizes while Standard waits", band: Standard, waiting: true, checkTaking: true,
			wantCTakes: true},
		{name: "Standard keeps to final sizes, a peer's requests counted", band: Standard, waiting: true, peerOnC: 3,
			checkTaking: true},
		{name: "Standard takes the room when nothing waits", band: Standard, checkTaking: true, wantATakes: true,
			wantCTakes: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := kvHarness(t, map[string][]time.Duration{"a": young, "b": young, "c": roomy})
				if tc.band == Critical {
					h = kvHarness(t, map[string][]time.Duration{"a": full, "b": young, "c": roomy})
				}
				p := Peers{ReserveShare: func(pool, seats int) int { return pool / 2 }, Seats: 33}
				if tc.peerOnC > 0 {
					p.Load = map[string]int{"c": tc.peerOnC}
					if tc.unsized {
						p.LoadUnsized = map[string]int{"c": tc.peerOnC}
					} else {
						p.LoadKV = map[string]float64{"c": float64(tc.peerOnC) * kvReq.final()}
					}
				}
				h.c.SetPeers(p)
				h.c.mu.Lock()
				defer h.c.mu.Unlock()
				now := h.clk.Now()
				h.c.lastCritical = now // the reserve is on
				if tc.waiting {
					h.c.bands[Standard].count++ // as a queued request counts (admitLocked), until the test ends
					h.c.totalCount++
					defer func() { h.c.bands[Standard].count--; h.c.totalCount-- }()
				}
				if tc.checkTaking {
					keep := h.c.kvKeepsRoomLocked(tc.band, "t", h.c.criticalReserveLocked(now), now)
					a, c := &h.c.endpoints[h.c.endpointIndex["a"]], &h.c.endpoints[h.c.endpointIndex["c"]]
					if got := h.c.kvTakesLocked(a, keep); got != tc.wantATakes {
						t.Errorf("a takes it: %v, want %v", got, tc.wantATakes)
					}
					if got := h.c.kvTakesLocked(c, keep); got != tc.wantCTakes {
						t.Errorf("c takes it: %v, want %v", got, tc.wantCTakes)
					}
					return
				}
				wantPlaced(t, h, tc.band, now, tc.wantPlaced)
			})
		})
	}
}

// TestKVWaitsForRoomWithLivePeers: at a replica with live peers, a request of a tenant under its share waits in the
// EPP when none of its endpoints with headroom has KV room for its prompt now (one replica owning the pool would place
// it on another server), and a replica offers its peers' protected requests only places where one of the mean size
// fits now. Alone, for a tenant over its share, for Critical, or where room is not counted, nothing changes.
func TestKVWaitsForRoomWithLivePeers(t *testing.T) {
	s := time.Second
	full := repeatAgo(10, 3*s)
	roomy := repeatAgo(8, 2*s)
	tests := []struct {
		name      string
		band      Band
		tenant    string
		alone     bool
		c         []time.Duration // c's requests; a and b are full
		unsizedOn string          // an endpoint holding a peer's request of unknown size
		peerOnC   int             // requests of kvReq's size a peer sent to c
		wantWaits bool
		wantOffer map[string]bool // whether each endpoint may be offered to a peer's protected request
	}{
		{name: "no room anywhere: the light request waits", band: Standard, tenant: "light", c: full, wantWaits: true,
			wantOffer: map[string]bool{"a": false, "b": false, "c": false}},
		{name: "room on c: it goes", band: Standard, tenant: "light", c: roomy,
			wantOffer: map[string]bool{"a": false, "b": false, "c": true}},
		{name: "a peer's requests fill c: it waits", band: Standard, tenant: "light", c: roomy, peerOnC: 3, wantWaits: true,
			wantOffer: map[string]bool{"a": false, "b": false, "c": false}},
		{name: "alone: placed as before", band: Standard, tenant: "light", c: full, alone: true,
			wantOffer: map[string]bool{"a": false, "b": false, "c": false}},
		{name: "the heavy tenant is not protected", band: Standard, tenant: "heavy", c: full,
			wantOffer: map[string]bool{"a": false, "b": false, "c": false}},
		{name: "Critical has its own rules", band: Critical, tenant: "light", c: full,
			wantOffer: map[string]bool{"a": false, "b": false, "c": false}},
		{name: "room not counted on a: it goes", band: Standard, tenant: "light", c: full, unsizedOn: "a",
			wantOffer: map[string]bool{"a": true, "b": false, "c": false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := kvHarness(t, map[string][]time.Duration{"a": full, "b": full, "c": tc.c})
				if !tc.alone {
					p := Peers{ReserveShare: func(pool, seats int) int { return pool / 2 }, Seats: 33,
						Load: map[string]int{}, LoadKV: map[string]float64{}, LoadUnsized: map[string]int{}}
					if tc.peerOnC > 0 {
						p.Load["c"], p.LoadKV["c"] = tc.peerOnC, float64(tc.peerOnC)*kvReq.final()
					}
					if tc.unsizedOn != "" {
						p.Load[tc.unsizedOn], p.LoadUnsized[tc.unsizedOn] = 1, 1
					}
					h.c.SetPeers(p)
				}
				h.c.mu.Lock()
				defer h.c.mu.Unlock()
				now := h.clk.Now()
				h.c.kvMeanFinal = kvReq.final()
				h.c.underShare = map[tenantKey]tenantArrivals{{Standard, "light"}: {here: 1, pool: 2}, {Critical, "light"}: {here: 1, pool: 2}}
				h.c.underShareAt = now
				if got := h.c.kvWaitsForRoomLocked(tc.band, tc.tenant, kvReq, []string{"a", "b", "c"}, now); got != tc.wantWaits {
					t.Errorf("waits: %v, want %v", got, tc.wantWaits)
				}
				for name, want := range tc.wantOffer {
					if got := h.c.kvOffersRoomLocked(&h.c.endpoints[h.c.endpointIndex[name]], now); got != want {
						t.Errorf("%s offered: %v, want %v", name, got, want)
					}
				}
			})
		})
	}
}
