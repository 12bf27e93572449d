package flowcontrol

import (
	"math"
	"time"
)

// Endpoint is one model-server endpoint as last scraped. The adapter passes the whole pool to
// Controller.UpdateEndpoints after each scrape; an endpoint missing from the snapshot is gone.
type Endpoint struct {
	// Name identifies the endpoint (e.g. namespace/pod); Bind uses the same names.
	Name string
	// WaitingQueue is the model server's count of requests waiting for a batch slot.
	WaitingQueue int
	// Running is the model server's count of running requests.
	Running int
	// KVCacheUsage is the fraction of KV cache in use, in [0, 1].
	KVCacheUsage float64
	// ScrapedAt is when these metrics were read. Older than the staleness threshold, the endpoint has no headroom;
	// requests the EPP sent to the endpoint before ScrapedAt are counted by the scrape and no longer reserved.
	ScrapedAt time.Time
	// Ejected reports that the scheduler leaves the endpoint out of its picks for now (passive outlier detection
	// saw it fail): it has no headroom, so admission dispatches nothing on capacity the scheduler will not use, and
	// Saturations ranks it last. Its metrics still count as fresh (the pool is not down) and its reservations stay.
	Ejected bool
}

// endpointState is an Endpoint plus what the EPP knows of it beyond its last scrape: the requests it sent there
// that the scrape does not yet show (reserved), the streamed requests it sent that have not had their first response
// chunk (pending), every request it sent there and has not released (inflight), and the concurrency learned from its
// scrapes. It caches what the fast path needs so that a scan is a few comparisons per endpoint.
type endpointState struct {
	Endpoint
	// adopted reports an endpoint that joined this controller's after a peer replica had been live (one a departed
	// peer owned, say) and has no seat count learned here yet: Saturations ranks it by the pool's seats
	// (Controller.rankSeatsLocked).
	adopted  bool
	reserved int
	// started counts the reserved requests that have had their first response chunk: running, no longer waiting.
	started int
	pending int
	// inflight counts every request the EPP dispatched here and has not released: running or waiting in the server,
	// or on their way there. It is fresher than any scrape: a request that ends frees its place at once.
	inflight int
	// foreign is how many more requests the last two scrapes both showed here than the EPP had sent (another EPP
	// replica's, or requests sent around the gateway): the endpoint's occupancy counts them too.
	foreign int
	// peer is how many requests other EPP replicas said they sent here and still run (Peers.Load); peerKV the KV size in
	// tokens they reach at their ends (Peers.LoadKV), and peerUnsized how many of them are of unknown size
	// (Peers.LoadUnsized).
	peer, peerUnsized int
	peerKV            float64
	// seats and capacity are concurrencyLearner.limits: the requests the endpoint is known to start at once (0 while
	// unknown) and the most admission keeps there under the Critical reserve (0: no bound).
	seats, capacity int
	// known is concurrencyLearner.known: the stated or learned concurrency (0 while neither is), the limit outside the
	// Critical reserve, where the KV term and tentative seats do not apply.
	known int
	// running counts the requests the EPP sent here that have had their first response chunk and not ended: running
	// there for sure, fresher than a scrape.
	running int
	// fullNs is when the occupancy last reached the seats, in Unix nanoseconds (0 never): an endpoint full recently
	// is seat-bound (Controller.seatBoundLocked). endedNs is when one of the EPP's requests there last ended (a probe
	// that starts after it may have taken its slot). Like the learner they outlive scrapes.
	fullNs, endedNs int64
	// learner, recon, firstChunk and pendingDoneNs outlive scrapes and are forgotten with the endpoint.
	learner concurrencyLearner
	recon   occupancyRecon
	// firstChunk is the learned time one prompt takes here from dispatch to its first response chunk (zero until a
	// streamed request has started here).
	firstChunk time.Duration
	// runTime is the learned time from a request's first chunk to its end here, and kvCapacity the learned tokens its
	// KV cache holds (kvroom.go); zero until learned. They outlive scrapes. kvFinal is the final KV size, in tokens, of
	// the EPP's requests in flight here.
	runTime             time.Duration
	kvCapacity, kvFinal float64
	// pendingDoneNs is when the pending prompts are expected to have all started, in Unix nanoseconds: each dispatch
	// of a pending prompt moves it to max(itself, dispatch time) plus the prompt's expected time (a virtual finish
	// clock, so prompts sent together queue behind one another), a pending prompt moved or released takes its time
	// back, and it is zero while nothing is pending.
	pendingDoneNs int64
	// sat is the largest of Saturation(Endpoint, reserved, thresholds) and the pending prompts' learned first-chunk
	// time over the pending time threshold; satReserve, what the Critical reserve judges by, is sat without the KV
	// term (seats stand for KV there) and with pending over the pending threshold; satBurst is sat with the burst
	// tier's thresholds; satRank is Saturation without the started requests, satRankSeats the same with the
	// occupancy over the seats its KV cache has room for (roomSeats) in place of the KV term, which rankAt completes
	// with the pending prompts for schedulers. Refresh them after changing any count.
	sat, satReserve, satBurst, satRank, satRankSeats float64
	scrapedNs                                        int64 // ScrapedAt in Unix nanoseconds; math.MinInt64 when unknown
}

// usable reports whether requests may be placed on e: its metrics are no older than cutoff (freshCutoff) and no
// outlier filter ejects it. An ejected endpoint still counts as fresh, so that an ejection never makes the pool look
// down, but its seats, headroom and rank are nobody's.
func (e *endpointState) usable(cutoff int64) bool {
	return e.scrapedNs >= cutoff && !e.Ejected
}

func newEndpointState(e Endpoint) endpointState {
	s := endpointState{Endpoint: e, scrapedNs: math.MinInt64}
	if !e.ScrapedAt.IsZero() {
		s.scrapedNs = e.ScrapedAt.UnixNano()
	}
	return s
}

// add counts r, just dispatched here, and refreshes the cached saturations. A pending r goes on the endpoint's
// finish clock: the clock moves to max(itself, r's dispatch) plus one prompt time, which r records as its share.
func (e *endpointState) add(r *reservation, th EndpointThresholds) {
	if r.pending {
		r.promptTime = e.promptTime(th)
		e.pendingDoneNs = max(e.pendingDoneNs, r.at.UnixNano()) + int64(r.promptTime)
	}
	e.tally(*r, +1)
	e.refresh(th)
}

// remove uncounts r, which leaves the endpoint (released, moved by Bind, or left out of its own ranking), and
// refreshes. A pending r takes its share back off the finish clock; a prompt that starts is not removed this way
// (Controller.Started), as the time it took has passed.
func (e *endpointState) remove(r reservation, th EndpointThresholds) {
	if r.pending {
		e.pendingDoneNs -= int64(r.promptTime)
	}
	e.tally(r, -1)
	e.refresh(th)
}

// tally adds r's share (sign +1 or -1) to the endpoint's counts; the caller refreshes.
func (e *endpointState) tally(r reservation, sign int) {
	e.inflight += sign
	e.kvFinal += float64(sign) * r.size.final()
	if r.started {
		e.running += sign
	}
	if r.unscraped {
		e.reserved += sign
		if r.started {
			e.started += sign
		}
	}
	if r.pending {
		e.pending += sign
	}
}

// refresh recomputes the concurrency and the cached saturations.
func (e *endpointState) refresh(th EndpointThresholds) {
	e.seats, e.capacity, _ = e.learner.limits(th, e.WaitingQueue > 0)
	e.known = e.learner.known(th, e.WaitingQueue > 0)
	kv := e.KVCacheUsage / th.KVCacheUtil
	base := max(queueSaturation(e.Endpoint, e.reserved, th), e.pendingTimeSaturation(th.PendingTime))
	e.sat = max(base, kv)
	e.satReserve = base
	if th.Pending > 0 {
		e.satReserve = max(base, float64(e.pending)/float64(th.Pending))
	}
	e.satBurst = e.sat
	if th.BurstQueueDepth > 0 {
		burst := th
		burst.QueueDepth = th.BurstQueueDepth
		var bt time.Duration
		if th.PendingTime > 0 {
			bt = th.BurstPendingTime
		}
		e.satBurst = max(queueSaturation(e.Endpoint, e.reserved, burst), e.pendingTimeSaturation(bt), kv)
	}
	rank := queueSaturation(e.Endpoint, e.reserved-e.started, th)
	e.satRank, e.satRankSeats = max(rank, kv), rank
	if e.seats > 0 {
		e.satRankSeats = max(rank, float64(e.occupancy())/float64(e.roomSeats()))
	}
	if e.pending == 0 {
		e.pendingDoneNs = 0
	}
}

// queuedAtMostRun reports whether the endpoint's latest scrape shows requests waiting while it runs the most it has
// run, its own limit not known and its KV cache not nearly full (requests there wait for a slot, not for blocks).
// One such scrape is no slot limit (a request sent just before a step waits for it, and a large server's prompts
// wait for the token budget), but a request sent there now would likely wait inside the server.
func (e *endpointState) queuedAtMostRun() bool {
	return e.known == 0 && e.WaitingQueue > 0 && e.Running > 0 && e.Running >= e.learner.maxRunning &&
		e.KVCacheUsage < kvQueueUsage
}

// occupancy is how many requests the endpoint holds by the EPP's count: its own in flight there and the foreign ones
// its scrapes showed, or the ones its peers said they sent there if more (peers' requests are foreign to scrapes).
func (e *endpointState) occupancy() int { return e.inflight + max(e.foreign, e.peer) }

// noteFull records now as the endpoint's last full moment if its occupancy is at its seats.
func (e *endpointState) noteFull(now time.Time) {
	if e.seats > 0 && e.occupancy() >= e.seats {
		e.fullNs = now.UnixNano()
	}
}

// hasSlot reports whether admission may send the endpoint one more request as far as its concurrency goes. Under
// the Critical reserve (seats) its occupancy must be below its capacity; otherwise below its known concurrency (stated
// or learned slots), if any. An endpoint holding none of the EPP's requests always has a slot, so that load the EPP
// did not send cannot close it for as long as that load lasts (the package doc's "Foreign load"); requests its peers
// said they sent there are not such load: they are counted, and their end is told.
func (e *endpointState) hasSlot(seats bool) bool {
	limit := e.known
	if seats {
		limit = e.capacity
	}
	return limit == 0 || e.holdsNone() || e.occupancy() < limit
}

// holdsNone reports whether the endpoint holds none of the EPP's requests nor any its peers said they sent there: the
// floor at which it always takes one more (hasSlot), whatever its seats, its KV room or the load its scrapes show.
func (e *endpointState) holdsNone() bool { return e.inflight == 0 && e.peer == 0 }

// occupied is the occupancy a request sent now finds, as far as it tells of the endpoint's slot limit: 0 while the
// EPP has nothing there, since the one request the foreign-load floor always lets in (hasSlot) waits for what is not
// the EPP's to see end.
func (e *endpointState) occupied() int {
	if e.inflight == 0 {
		return 0
	}
	return e.occupancy()
}

// probeStarted folds in the first chunk, at now, of r if it was sent beyond the learned slot limit not yet confirmed:
// a probe, or a request sent before the limit was learned that waited there while it was (the first queue a small
// endpoint shows is one). It confirms the limit if one of the EPP's requests there ended since r was sent and r
// waited longer than a prompt takes there (twice the learned time: it waited for a slot, not for a step), and
// disproves it if none ended, nor does within a prompt's time (an end late to the EPP). The caller refreshes.
func (e *endpointState) probeStarted(r reservation, now time.Time, th EndpointThresholds) {
	if l := &e.learner; l.slots == 0 || l.confirmed || r.occupied < l.slots {
		return
	}
	ended := e.endedNs >= r.at.UnixNano()
	e.learner.probeStarted(ended, now.Sub(r.at) > 2*e.promptTime(th), now.UnixNano(), e.endDeadline(now, th))
}

// endDeadline is how long from now the EPP waits for the end of a request there before it believes its own count
// (concurrencyLearner.doubt): one prompt's time, the least after the server started a request in a freed slot that its
// first chunk can precede the end that freed it.
func (e *endpointState) endDeadline(now time.Time, th EndpointThresholds) int64 {
	return now.Add(e.promptTime(th)).UnixNano()
}

// roomSeats is how many of its seats (at least 1) the endpoint's KV cache has room for: those a request starts in at
// once and keeps its blocks in while it decodes, up to kvRoomFill of what fills its KV cache. A KV-bound server's
// seats (the most it has run) count requests of a moment when they were short; one holding more than its KV cache
// keeps for them admits a new prompt only once blocks free, or preempts the newest request as decoding runs out of
// blocks, so a request ranks such a server by its room, not its seats, and goes where it starts at once.
func (e *endpointState) roomSeats() int {
	return min(e.seats, max(1, int(math.Min(e.kvRoom(), math.MaxInt32))))
}

// kvRoom is how many requests of the current mix fit in kvRoomFill of the endpoint's KV cache (+Inf while its KV use
// is unknown or it reports none).
func (e *endpointState) kvRoom() float64 {
	if e.learner.perKV <= 0 {
		return math.Inf(1)
	}
	return kvRoomFill * e.learner.perKV
}

// slotBound is the endpoint's learned slot limit when its KV cache has room for that many requests (roomSeats), else
// 0: a running count that plateaus where the KV cache fills is the KV cache's limit for the current mix, not a
// number of slots other endpoints of the pool would share.
func (e *endpointState) slotBound() int {
	if n := e.learner.slots; n > 0 && float64(n) <= e.kvRoom() {
		return n
	}
	return 0
}

// kvRoomFill is the share of what fills an endpoint's KV cache (concurrencyLearner.perKV, the running count over KV
// use) a request still starts in at once there: a KV-bound server holding 90% of it waits for blocks to free before
// it admits another prompt (measured in testbed/bench/scenarios/README.md, "KV room").
const kvRoomFill = 0.9

// firstChunkOr is the learned first-chunk time, or fallback while nothing is learned here yet (a new endpoint, or
// one back from a gap): a threshold then stands in for one prompt until its first chunk teaches the endpoint's time.
func (e *endpointState) firstChunkOr(fallback time.Duration) time.Duration {
	if e.firstChunk > 0 {
		return e.firstChunk
	}
	return fallback
}

// promptTime is the expected time of one prompt here from dispatch to its first chunk: the learned one, or while
// nothing is learned the pending time threshold (zero when that is disabled too).
func (e *endpointState) promptTime(th EndpointThresholds) time.Duration {
	return e.firstChunkOr(th.PendingTime)
}

// rankAt is what schedulers rank the endpoint by at nowNs: satRank or, while a prompt is pending here and if larger,
// 1 plus the time a new prompt would take here to its first chunk (the wait until the pending prompts are expected
// to have started, then its own prompt time) over the pending time threshold. Above 1 because a new prompt would
// share its first step with a pending one, as slow to start as on a saturated endpoint. Among endpoints that are all
// computing a prompt, the one where a new prompt is expected to start answering first thus ranks lowest, whatever
// their speeds; with the time bound disabled the number of pending prompts stands in.
func (e *endpointState) rankAt(nowNs int64, th EndpointThresholds, seats bool) float64 {
	rank := e.satRank
	if seats {
		rank = e.satRankSeats
	}
	if e.pending == 0 {
		return rank
	}
	if th.PendingTime <= 0 {
		return max(rank, float64(e.pending))
	}
	wait := time.Duration(max(0, e.pendingDoneNs-nowNs))
	return max(rank, 1+float64(wait+e.promptTime(th))/float64(th.PendingTime))
}

// pendingTimeSaturation is the learned first-chunk time of the endpoint's pending prompts over threshold (0 when
// threshold is 0, which disables the time).
func (e *endpointState) pendingTimeSaturation(threshold time.Duration) float64 {
	if threshold <= 0 || e.pending == 0 {
		return 0
	}
	return float64(e.pending) * float64(e.firstChunkOr(threshold)) / float64(threshold)
}

// smoothDuration folds sample into the exponentially weighted average avg (zero: nothing learned yet, sample is it).
func smoothDuration(avg, sample time.Duration, weight float64) time.Duration {
	if avg == 0 {
		return sample
	}
	return avg + time.Duration(weight*float64(sample-avg))
}

// firstChunkWeight is the weight of each new sample in the learned first-chunk time: about the last five prompts count.
const firstChunkWeight = 0.2

// learnFirstChunk folds one prompt's time from dispatch to first chunk, already divided among the prompts that were
// pending ahead of it (they share its prefill steps), into the learned first-chunk time; the caller refreshes.
func (e *endpointState) learnFirstChunk(d time.Duration) {
	e.firstChunk = smoothDuration(e.firstChunk, d, firstChunkWeight)
}

// saturationFor is the saturation headroom is judged by in the normal tier: satReserve where seats stand for the KV
// cache (seats: under the Critical reserve, or for a tenant under its share), else sat.
func (e *endpointState) saturationFor(seats bool) float64 {
	if seats {
		return e.satReserve
	}
	return e.sat
}

// reservation is one dispatched request counted against an endpoint until Release: in flight there, as unscraped
// until a scrape covers it, and, if its response streams, as pending until its first response chunk
// (Controller.Started).
type reservation struct {
	endpoint string
	at       time.Time
	// ahead is how many prompts were pending on endpoint when the request was sent there.
	ahead     int
	unscraped bool
	pending   bool
	started   bool
	// occupied is the endpoint's occupancy when the request was sent (endpointState.occupied): at or beyond its
	// learned slot limit, its first chunk confirms or disproves the limit (probeStarted).
	occupied int
	// promptTime is what a pending reservation added to its endpoint's finish clock (endpointState.add).
	promptTime time.Duration
	// size is the request's KV size, and startedNs when it had its first chunk (0 before), in Unix nanoseconds
	// (kvroom.go).
	size      kvSize
	startedNs int64
}

// Saturation is an endpoint's load relative to its thresholds: the largest of (waiting + reserved) / QueueDepth,
// KV cache usage / KVCacheUtil and, if Running > 0, running / Running. 1.0 means "at threshold". The controller judges
// headroom by the larger of this and the endpoint's pending prompts' learned time over PendingTime
// (endpointState.refresh), against the band's ceiling, in the normal or the burst tier. Under the Critical reserve the
// KV term gives way to the endpoint's seats (concurrencyLearner), which no band exceeds.
func Saturation(e Endpoint, reserved int, th EndpointThresholds) float64 {
	return max(queueSaturation(e, reserved, th), e.KVCacheUsage/th.KVCacheUtil)
}

// queueSaturation is Saturation without the KV term.
func queueSaturation(e Endpoint, reserved int, th EndpointThresholds) float64 {
	s := float64(e.WaitingQueue+reserved) / float64(th.QueueDepth)
	if th.Running > 0 {
		s = max(s, float64(e.Running)/float64(th.Running))
	}
	return s
}

// freshCutoff returns the Unix-nanosecond scrape time at or after which metrics are fresh at now.
func freshCutoff(now time.Time, staleness time.Duration) int64 {
	return now.UnixNano() - int64(staleness)
}
