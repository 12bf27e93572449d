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

// endpointState is an Endpoint plus the requests the EPP sent it that its last scrape does not yet show (reserved)
// and the streamed requests it sent that have not had their first response chunk (pending). It caches what the fast
// path needs so that a scan is two comparisons per endpoint.
type endpointState struct {
	Endpoint
	reserved int
	// started counts the reserved requests that have had their first response chunk: running, no longer waiting.
	started int
	pending int
	// firstChunk is the learned time one prompt takes here from dispatch to its first response chunk (zero until a
	// streamed request has started here); it outlives scrapes and is forgotten with the endpoint.
	firstChunk time.Duration
	// pendingDoneNs is when the pending prompts are expected to have all started, in Unix nanoseconds: each dispatch
	// of a pending prompt moves it to max(itself, dispatch time) plus the prompt's expected time (a virtual finish
	// clock, so prompts sent together queue behind one another), a pending prompt moved or released takes its time
	// back, and it is zero while nothing is pending. Like firstChunk it outlives scrapes.
	pendingDoneNs int64
	// sat is the largest of Saturation(Endpoint, reserved, thresholds) and the pending prompts' learned first-chunk
	// time over the pending time threshold; satReserve, what the Critical reserve judges by, is the larger of sat and
	// pending over the pending threshold; satBurst is sat with the burst tier's thresholds; satRank is Saturation
	// without the started requests, which rankAt completes with the pending prompts for schedulers. Refresh them after
	// changing any count.
	sat, satReserve, satBurst, satRank float64
	scrapedNs                          int64 // ScrapedAt in Unix nanoseconds; math.MinInt64 when unknown
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

// refresh recomputes the cached saturations.
func (e *endpointState) refresh(th EndpointThresholds) {
	e.sat = max(Saturation(e.Endpoint, e.reserved, th), e.pendingTimeSaturation(th.PendingTime))
	e.satReserve = e.sat
	if th.Pending > 0 {
		e.satReserve = max(e.sat, float64(e.pending)/float64(th.Pending))
	}
	e.satBurst = e.sat
	if th.BurstQueueDepth > 0 {
		burst := th
		burst.QueueDepth = th.BurstQueueDepth
		var bt time.Duration
		if th.PendingTime > 0 {
			bt = th.BurstPendingTime
		}
		e.satBurst = max(Saturation(e.Endpoint, e.reserved, burst), e.pendingTimeSaturation(bt))
	}
	e.satRank = Saturation(e.Endpoint, e.reserved-e.started, th)
	if e.pending == 0 {
		e.pendingDoneNs = 0
	}
}

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
func (e *endpointState) rankAt(nowNs int64, th EndpointThresholds) float64 {
	if e.pending == 0 {
		return e.satRank
	}
	if th.PendingTime <= 0 {
		return max(e.satRank, float64(e.pending))
	}
	wait := time.Duration(max(0, e.pendingDoneNs-nowNs))
	return max(e.satRank, 1+float64(wait+e.promptTime(th))/float64(th.PendingTime))
}

// pendingTimeSaturation is the learned first-chunk time of the endpoint's pending prompts over threshold (0 when
// threshold is 0, which disables the time).
func (e *endpointState) pendingTimeSaturation(threshold time.Duration) float64 {
	if threshold <= 0 || e.pending == 0 {
		return 0
	}
	return float64(e.pending) * float64(e.firstChunkOr(threshold)) / float64(threshold)
}

// firstChunkWeight is the weight of each new sample in the learned first-chunk time: about the last five prompts count.
const firstChunkWeight = 0.2

// learnFirstChunk folds one prompt's time from dispatch to first chunk, already divided among the prompts that were
// pending ahead of it (they share its prefill steps), into the learned first-chunk time; the caller refreshes.
func (e *endpointState) learnFirstChunk(d time.Duration) {
	if e.firstChunk == 0 {
		e.firstChunk = d
	} else {
		e.firstChunk += time.Duration(firstChunkWeight * float64(d-e.firstChunk))
	}
}

// saturationFor is the saturation headroom is judged by in the normal tier: satReserve under the Critical reserve,
// else sat.
func (e *endpointState) saturationFor(reserve bool) float64 {
	if reserve {
		return e.satReserve
	}
	return e.sat
}

// reservation is one dispatched request counted against an endpoint: as unscraped until a scrape covers it, and, if
// its response streams, as pending until its first response chunk (Controller.Started). Release ends both.
type reservation struct {
	endpoint string
	at       time.Time
	// ahead is how many prompts were pending on endpoint when the request was sent there.
	ahead     int
	unscraped bool
	pending   bool
	started   bool
	// promptTime is what a pending reservation added to its endpoint's finish clock (endpointState.add).
	promptTime time.Duration
}

// Saturation is an endpoint's load relative to its thresholds: the largest of
// (waiting + reserved) / QueueDepth, KV cache usage / KVCacheUtil and, if Running > 0, running / Running.
// 1.0 means "at threshold". The controller judges headroom by the larger of this and the endpoint's pending prompts'
// learned time over PendingTime (endpointState.refresh), against the band's ceiling, in the normal or the burst tier.
func Saturation(e Endpoint, reserved int, th EndpointThresholds) float64 {
	s := float64(e.WaitingQueue+reserved) / float64(th.QueueDepth)
	if kv := e.KVCacheUsage / th.KVCacheUtil; kv > s {
		s = kv
	}
	if th.Running > 0 {
		if r := float64(e.Running) / float64(th.Running); r > s {
			s = r
		}
	}
	return s
}

// freshCutoff returns the Unix-nanosecond scrape time at or after which metrics are fresh at now.
func freshCutoff(now time.Time, staleness time.Duration) int64 {
	return now.UnixNano() - int64(staleness)
}
