package flowcontrol

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// KV room counted at each request's final size. A KV-bound server (vLLM's scheduler) admits a waiting prompt as soon
// as its prompt's blocks are free, whatever its running requests will need as they decode; when a decoding request
// then finds no free block, the server preempts the request it admitted last, which recomputes later, and the blocks
// that an end frees go first to what it preempted and queued. Room counted from the latest scrape's KV use (requests
// per full cache measured at mid-decode) overstates what a server can still take, so a protected request sent where
// a seat is free waits inside the server for blocks (measured: testbed/bench/scenarios/README.md, "Lumps of room").
//
// The EPP knows each of its requests' size (Request.EstimatedCost, of which Request.OutputTokens is the expected
// output) and when each started answering and, from its ends, how long a request runs on an endpoint (runTime). From
// these it predicts every request's KV size at any moment, the prompt at its first chunk growing linearly to its final
// size at its predicted end, and it learns each endpoint's KV capacity in tokens from the scrapes (learnKVCapacity):
// what its started and admitted requests hold over the KV use the scrape shows. With the capacity learned:
//
//   - a protected request (Critical under its reserve, or a tenant under its share) goes where its prompt fits now,
//     counting every request of the EPP's there, started or not, at its size now (a preempted request counts too: it
//     waits at the head of the server's queue for as many blocks), and where possible where it also stays: no
//     predicted moment before its own end at which the requests there, growing and ending as predicted, need more
//     blocks than the cache has (kvPlaceLocked). It goes at once; nothing is held.
//   - while protected requests are about and the pool is saturated (lowerBandsSaturatedLocked), an unprotected
//     request goes only where every request there, and one more of the mean final size of the requests dispatched
//     (kvMeanFinal: the band's queue is dispatched from its head, whose size is not the arriving request's), fits at
//     its final size (fitsFinal): it never takes blocks the running requests will grow into, so it neither is
//     preempted nor leaves a prompt waiting inside the server; the room left between what the requests hold now and
//     what they will hold is the protected requests' (kvTakesLocked). Below saturation it takes what the seats allow.
//
// With live peers each replica counts its own endpoints so: the requests its peers sent there count at the final sizes
// the peers told (Peers.LoadKV; the EPP does not know when they started, and a final size is the most a request holds);
// whether the pool is saturated is judged on this replica's own queue (lowerBandsSaturatedLocked). A protected request
// with no endpoint of room waits here for one, or for a peer's place offered with room (kvWaitsForRoomLocked).
// Nothing applies to an endpoint whose capacity or run time is not learned, or that carries load of unknown size
// (foreign beyond its peers' requests, or a peer's that did not tell its sizes).

// kvSize is a request's KV size in tokens: its prompt, held from its start, and its expected output, which it grows
// into while it decodes.
type kvSize struct{ prompt, output float64 }

// sizeOf is req's KV size: its estimated cost, of which OutputTokens (no more than the cost) is the output.
func sizeOf(req Request) kvSize {
	cost := costOf(req)
	out := math.Min(float64(req.OutputTokens), cost)
	return kvSize{prompt: cost - out, output: out}
}

// FinalKVTokens is req's KV size at its end, in tokens: its prompt and expected output (Request.EstimatedCost). A
// replica that sends req to a peer's endpoint tells the owner this (Peers.LoadKV), which counts its KV room with it.
func FinalKVTokens(req Request) int { return tokensOf(sizeOf(req)) }

// tokensOf is s's final size in whole tokens, as the peer exchange tells it.
func tokensOf(s kvSize) int { return int(math.Round(s.final())) }

// final is the size at the request's end.
func (s kvSize) final() float64 { return s.prompt + s.output }

// at is the size at nowNs of a request that started (first chunk) at startedNs and runs for run: the prompt plus the
// share of the output decoded by then. A request not started (startedNs 0), or with no run time known, holds its prompt.
func (s kvSize) at(startedNs, nowNs int64, run time.Duration) float64 {
	if startedNs == 0 || run <= 0 || nowNs <= startedNs {
		return s.prompt
	}
	return s.prompt + s.output*math.Min(1, float64(nowNs-startedNs)/float64(run))
}

// runTimeWeight is the weight of each end in the learned time from first chunk to end: about the last five count.
const runTimeWeight = 0.2

// learnRunTime folds one request's time from its first chunk to its end into the endpoint's learned run time.
func (e *endpointState) learnRunTime(d time.Duration) {
	e.runTime = smoothDuration(e.runTime, max(d, 0), runTimeWeight)
}

// kvLearnUsage is the least KV use a scrape must show to teach an endpoint's capacity: below it the requests'
// estimated sizes, not the cache, dominate the quotient, and an endpoint that never fills its cache needs no capacity.
const kvLearnUsage = 0.5

// kvCapacityWeight is the weight of each scrape in the learned KV capacity: about the last ten scrapes count.
const kvCapacityWeight = 0.1

// kvScrape is what the EPP's requests on an endpoint held when its scrape was taken: started is how many had started
// by then and held their size at that moment (held), pending how many had been sent but not started, whose prompts
// sum to pendingPrompt.
type kvScrape struct {
	started, pending    int
	held, pendingPrompt float64
}

// add counts r, sent before a scrape taken at scrapedNs, on an endpoint whose requests run for run.
func (s *kvScrape) add(r reservation, scrapedNs int64, run time.Duration) {
	if r.started && r.startedNs <= scrapedNs {
		s.started++
		s.held += r.size.at(r.startedNs, scrapedNs, run)
		return
	}
	s.pending++
	s.pendingPrompt += r.size.prompt
}

// learnKVCapacity folds one scrape into the endpoint's learned KV capacity in tokens: what its requests held then over
// its KV use. It learns only when the scrape shows the EPP's requests alone (no foreign or peer load), a KV use of at
// least kvLearnUsage, a run time learned, and a running count the EPP can account for: every started request running
// (fewer means the server preempted one, which holds nothing until it resumes) and the rest of the running count
// among the prompts sent and not started, each holding its prompt.
func (e *endpointState) learnKVCapacity(s kvScrape) {
	if e.foreign > 0 || e.peer > 0 || e.runTime <= 0 || e.KVCacheUsage < kvLearnUsage {
		return
	}
	extra := e.Running - s.started
	if extra < 0 || extra > s.pending || e.WaitingQueue > s.pending-extra {
		return
	}
	held := s.held
	if extra > 0 {
		held += float64(extra) * s.pendingPrompt / float64(s.pending)
	}
	if held <= 0 { // the KV use is not of requests the EPP counts there (a gauge not yet updated): nothing to learn
		return
	}
	sample := held / e.KVCacheUsage
	if e.kvCapacity == 0 {
		e.kvCapacity = sample
	} else {
		e.kvCapacity += kvCapacityWeight * (sample - e.kvCapacity)
	}
}

// kvKnown reports whether the endpoint's KV room is counted: it has seats (a small server that queued while running
// few requests, or a stated or learned slot limit: large-batch servers, whose requests contend in prefill long before
// they run out of places, keep the saturation thresholds alone, as they do for seats), its capacity and run time are
// learned, and every request on it is of a size the EPP knows: its own, and its peers' where they told their sizes
// (Peers.LoadKV; peerUnsized counts those of peers that did not), with no load its scrapes show beyond those (foreign
// over the peers' count). Counted on the large-batch fleet, the A10G-like servers' KV room cost its Sheddable band
// throughput (testbed/bench/scenarios/README.md, "KV room at final size").
func (e *endpointState) kvKnown() bool {
	return e.seats > 0 && e.kvCapacity > 0 && e.runTime > 0 && e.foreign <= e.peer && e.peerUnsized == 0
}

// fitsFinal reports whether one more request of final size final fits at the endpoint's final sizes: every request of
// the EPP's there and of its peers', and the new one, at its final size within the learned capacity, to the nearest
// request. The capacity is learned from estimated sizes (a prompt's tokens from its body's bytes, its blocks rounded up
// by the server), a few percent off (testbed/bench/scenarios/README.md, "KV room at final size"). Counted to the
// nearest request, an error under half a request does not cost a place. An endpoint whose room is not known, or that
// holds none of the EPP's requests nor its peers', always fits: an empty endpoint is never full (hasSlot's floor).
func (e *endpointState) fitsFinal(final float64) bool {
	return !e.kvKnown() || e.holdsNone() || e.kvFinal+e.peerKV+final/2 <= e.kvCapacity
}

// kvFinalWeight is the weight of each dispatched request in the mean final size (kvMeanFinal).
const kvFinalWeight = 0.05

// noteKVSizeLocked folds a request's size, dispatched to an endpoint of learned KV capacity capacity (0: not learned),
// into the mean final size unprotected requests are judged by. A size counts at most the capacity: the output part
// comes from the client's max_tokens, which one client can set to millions of tokens.
func (c *Controller) noteKVSizeLocked(s kvSize, capacity float64) {
	final := s.final()
	if capacity > 0 {
		final = min(final, capacity)
	}
	if c.kvMeanFinal == 0 {
		c.kvMeanFinal = final
		return
	}
	c.kvMeanFinal += kvFinalWeight * (final - c.kvMeanFinal)
}

// kvKeepsRoomLocked reports whether a request of tenant in band is unprotected while protected requests are about and
// the pool is saturated, so that it may go only where it fits at its final size (kvTakesLocked): below Critical under
// the Critical reserve, or in a band with a tenant under its share, not itself under its share, and while the lower
// bands are saturated (lowerBandsSaturatedLocked).
func (c *Controller) kvKeepsRoomLocked(band Band, tenant string, reserve bool, now time.Time) bool {
	if band == Critical || !c.lowerBandsSaturatedLocked() {
		return false
	}
	return (reserve || c.bandUnderShareLocked(band, now)) && !c.isUnderShareLocked(band, tenant, now)
}

// lowerBandsSaturatedLocked reports whether the pool is saturated: a request of a band below Critical waits in the
// EPP, the lower bands' demand beyond what their headroom lets start. Only then does KV room keep unprotected
// requests to their final sizes. Critical is about in every phase of a mixed load; kept to final sizes whenever it
// was, the returns promised to Sheddable after an overload were answered 429 again in the recovery phase at half the
// fleet's capacity, when a wave of them filled the servers' seats with nothing waiting in the EPP (idle seats were as
// few as under the overload, so seats do not tell the two apart). Waiting for a tenth of the drain-rate window before
// counting the pool saturated measured no better (testbed/bench/scenarios/README.md, "KV room at final size while
// the pool is saturated"). A band that sheds at once shows no backlog by its 429s: only a band that queues, or a
// promised return, shows the overload lasts.
func (c *Controller) lowerBandsSaturatedLocked() bool {
	return c.totalCount > int64(c.bands[Critical].count)
}

// ReservedKVTokens is the KV size at its end, in tokens, of request id, which holds a reservation here (0 when it holds
// none): a request the scheduler places on a peer's endpoint is told to the owner with it (Peers.LoadKV).
func (c *Controller) ReservedKVTokens(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return tokensOf(c.reservations[id].size)
}

// kvWaitsForRoomLocked reports whether a protected request of tenant in band, below Critical and in a band that queues,
// of size s waits in the EPP rather than go to one of names (the endpoints with headroom for it) at a replica with live
// peers: every one has its KV room counted (kvKnown) and none has room for its prompt now (an endpoint holding no
// request, the EPP's or a peer's, always has: nothing there will free any). One replica owning the pool places such a
// request where its prompt fits now (kvPlaceLocked), among every endpoint of the pool; a replica owning one or two of
// them often has none, and a request sent there waited inside the server for blocks (testbed/bench/scenarios/README.md,
// "KV room with live peers"). Waiting here it counts among the requests of tenants under their share waiting
// (SeatSummary.ProtectedWaiting), to which the peers offer the places they keep, only where such a request fits
// (kvOffersRoomLocked); it goes here as soon as one of its own endpoints has room. Alone nothing waits: with no
// endpoint of room, the request goes where headroom put it, as before.
func (c *Controller) kvWaitsForRoomLocked(band Band, tenant string, s kvSize, names []string, now time.Time) bool {
	if c.peers.ReserveShare == nil || band == Critical || c.cfg.Bands[band].RejectWhenSaturated || len(names) == 0 ||
		!c.isUnderShareLocked(band, tenant, now) {
		return false
	}
	want, entries, counted := c.kvCountedLocked(names)
	if !counted {
		return false
	}
	nowNs := now.UnixNano()
	for _, name := range names {
		i := want[name]
		if e := &c.endpoints[i]; e.holdsNone() || e.kvFitsNow(entries[i], nowNs, s.prompt) {
			return false
		}
	}
	return true
}

// kvOffersRoomLocked reports whether e may be offered to the peers' protected requests (offerSeatsLocked) as far as its
// KV room goes: where it is counted, what the requests there hold now, the peers' at their final sizes, leaves room for
// one of the mean final size (kvMeanFinal: the offer is taken by whichever request waits at a peer, whose size is not
// known here). A seat free by count on a server whose cache is full starts a peer's request no sooner than a seat of
// its own replica's would.
func (c *Controller) kvOffersRoomLocked(e *endpointState, now time.Time) bool {
	if c.kvMeanFinal == 0 || !e.kvKnown() {
		return true
	}
	i := c.endpointIndex[e.Name]
	entries := c.kvEntriesLocked(map[string]int{e.Name: i})
	return e.kvFitsNow(entries[i], now.UnixNano(), c.kvMeanFinal)
}

// kvTakesLocked reports whether e may take an unprotected request (keep: kvKeepsRoomLocked) as far as KV room goes.
func (c *Controller) kvTakesLocked(e *endpointState, keep bool) bool {
	return !keep || c.kvMeanFinal == 0 || e.fitsFinal(c.kvMeanFinal)
}

// kvEntry is one of the EPP's requests on an endpoint as KV room sees it: its size, and when it started (0: not yet).
type kvEntry struct {
	size      kvSize
	startedNs int64
}

// kvEntriesLocked returns the EPP's requests on each endpoint (by index), for the endpoints in want.
func (c *Controller) kvEntriesLocked(want map[string]int) [][]kvEntry {
	out := make([][]kvEntry, len(c.endpoints))
	for _, r := range c.reservations {
		if i, ok := want[r.endpoint]; ok {
			out[i] = append(out[i], kvEntry{size: r.size, startedNs: r.startedNs})
		}
	}
	return out
}

// kvCountedLocked returns, for names, each one's endpoint index and the EPP's requests on each (kvEntriesLocked);
// counted is false, and nothing is gathered, when any of them has KV room that cannot be counted (kvKnown).
func (c *Controller) kvCountedLocked(names []string) (index map[string]int, entries [][]kvEntry, counted bool) {
	index = make(map[string]int, len(names))
	for _, name := range names {
		i := c.endpointIndex[name]
		if !c.endpoints[i].kvKnown() {
			return nil, nil, false
		}
		index[name] = i
	}
	return index, c.kvEntriesLocked(index), true
}

// kvFitsNow reports whether tokens more fit now in the endpoint's KV cache, which entries (the EPP's requests there)
// share with its peers' requests, counted at their final sizes (the most they hold).
func (e *endpointState) kvFitsNow(entries []kvEntry, nowNs int64, tokens float64) bool {
	return kvHeld(entries, nowNs, e.runTime)+tokens <= e.kvCapacity-e.peerKV
}

// kvHeld is what entries hold at nowNs on an endpoint whose requests run for run.
func kvHeld(entries []kvEntry, nowNs int64, run time.Duration) float64 {
	held := 0.0
	for _, x := range entries {
		held += x.size.at(x.startedNs, nowNs, run)
	}
	return held
}

// kvStays reports whether a request of size s sent now to an endpoint of KV capacity capacity, holding entries, keeps
// its blocks until its own end: at no predicted end of a request there (just before it frees its blocks), nor at the
// new request's own end, do the requests still there need more than the capacity (the server would preempt the
// newest, this one). Requests not started are taken to start now; a request past its predicted end is still there, at
// its final size, just after now (run is a mean: many run longer).
//
// Between ends every request there grows linearly, so what they need at a moment t is a + b·(t − now) summed over the
// requests still there; ends are swept in order and each one's part is taken out as it frees its blocks.
func kvStays(entries []kvEntry, s kvSize, capacity float64, nowNs int64, run time.Duration) bool {
	endNs := nowNs + int64(run)
	type part struct {
		endNs int64
		a, b  float64 // the request's size at now, and its growth per nanosecond until its end
	}
	parts := make([]part, 0, len(entries))
	var a, b float64
	for _, x := range entries {
		st := x.startedNs
		if st == 0 {
			st = nowNs
		}
		p := part{endNs: st + int64(run), a: x.size.at(st, nowNs, run)}
		if p.endNs <= nowNs {
			p.endNs = nowNs + 1 // overdue: at its final size until an end the EPP cannot predict
		} else if run > 0 {
			p.b = x.size.output / float64(run)
		}
		parts = append(parts, p)
		a += p.a
		b += p.b
	}
	slices.SortFunc(parts, func(x, y part) int { return cmp.Compare(x.endNs, y.endNs) })
	gone := 0
	check := func(t int64) bool {
		for gone < len(parts) && parts[gone].endNs < t { // ended before t: its blocks are free again
			a -= parts[gone].a
			b -= parts[gone].b
			gone++
		}
		return s.at(nowNs, t, run)+a+b*float64(t-nowNs) <= capacity
	}
	for _, p := range parts {
		if p.endNs > nowNs && p.endNs < endNs && !check(p.endNs) {
			return false
		}
	}
	return check(endNs)
}

// kvPlaceLocked narrows where a protected request of size s goes among names (the endpoints with headroom; best the one
// headroomLocked picked): to those where its prompt fits now and it stays (kvStays), else to those where it fits now,
// else leaves them as they are. It leaves them alone too when any of them has room that cannot be counted (kvKnown),
// and for a request that is not protected. A peer's requests there count at their final sizes. best becomes the least
// saturated endpoint kept (best itself if kept).
func (c *Controller) kvPlaceLocked(band Band, tenant string, s kvSize, best int, names []string, now time.Time) (int, []string) {
	if len(names) < 2 {
		return best, names
	}
	if !(band == Critical && c.criticalReserveLocked(now) || band != Critical && c.isUnderShareLocked(band, tenant, now)) {
		return best, names
	}
	want, entries, counted := c.kvCountedLocked(names)
	if !counted {
		return best, names
	}
	nowNs := now.UnixNano()
	var fits, stays []string
	for _, name := range names {
		i := want[name]
		e := &c.endpoints[i]
		if !e.kvFitsNow(entries[i], nowNs, s.prompt) {
			continue
		}
		fits = append(fits, name)
		// The peers' requests there count at the most they hold.
		if kvStays(entries[i], s, e.kvCapacity-e.peerKV, nowNs, e.runTime) {
			stays = append(stays, name)
		}
	}
	kept := stays
	if len(kept) == 0 {
		kept = fits
	}
	if len(kept) == 0 || len(kept) == len(names) {
		return best, names
	}
	newBest := -1
	for _, name := range kept {
		i := want[name]
		if i == best {
			return best, kept
		}
		if newBest < 0 || c.endpoints[i].satReserve < c.endpoints[newBest].satReserve {
			newBest = i
		}
	}
	return newBest, kept
}
