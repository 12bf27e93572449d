package flowcontrol

import (
	"fmt"
	"math"
)

// concurrencyLearner learns from an endpoint's scrapes how many requests it runs at once, the number admission fills
// it to and no further (see Endpoint and APIEndpointThresholds.Concurrency):
//
//   - Its slot limit: the running count it plateaus at while requests wait there, when no scrape has ever shown it
//     running more. A server with a waiting queue admits a waiting request whenever it can; a running count that
//     stays put over several scrapes while requests wait, at the most it has ever run, is the most it will run (vLLM's
//     --max-num-seqs, say). A queue that comes and goes within a step (a request sent just as a slot freed waits for
//     the next step) or that drains while the count moves (several prompts per step on a large server) is not a
//     plateau; neither is one below the most the server has run (a request waiting for a LoRA slot, or for KV blocks).
//   - Its KV limit: how many requests of the current mix its KV cache holds, the running count over the fraction of
//     KV blocks in use (smoothed), times the KV threshold, which leaves the running requests room to grow as they
//     decode. A server that reports no KV use has none.
//
// Neither rule learns while the KV cache is nearly full (kvQueueUsage): a KV-bound server's running count plateaus
// where its blocks run out, a number that moves with the mix and that its KV limit already bounds; taken for a slot
// limit it would be cut again by the KV threshold.
//
// A small endpoint (running fewer than largeBatchRunning) learns its slot limit fast: from the second consecutive
// scrape that shows requests waiting there at the most it has run while all it runs are the EPP's requests that have
// had their first chunk (decoding: a server still computing a long prompt holds its running count with a queue while
// no step ends, and has slots to spare), so that admission stops filling its queue within two scrape intervals of the
// first sign of one. A limit can be the EPP's own doing (a request sent just before a step waits for it), so a
// request sent at or beyond it tells whether it is real (probeStarted): starting only after one of the EPP's
// requests there ended, and after waiting longer than a prompt takes, it confirms the limit, which from then on is
// strict; starting with nothing ended there, it disproves it, and the endpoint learns only from the slower plateau
// rule from then on. The request that waited there when the limit was learned is usually such a request; until one
// has told, the endpoint may run one more while nothing waits there (the probe).
//
// A step-bound endpoint's limit (stepBoundRunning or more) is never confirmed by such a wait: there a request waits
// for the server's next step, not for a slot, and a step of that many running requests with a batch of prompts
// outlasts twice a prompt's time, so a plateau that is no slot limit (requests ending and admitted one for one while
// the count ramps, each waiting for the next step) would pass and be strict for good: a confirmed limit is never sent
// more, so no scrape shows the endpoint running more. It stays tentative: probed outside the Critical reserve while
// nothing waits there, and forgotten by a scrape showing more running; a request beyond it waits for the first of
// many ends, about a step.
//
// The EPP's own view of an endpoint (a probe that started with none ended, more of its requests started and not
// ended than the endpoint has run) can be ahead of the server by an end not yet heard of: under CPU load the end of a
// response reaches the EPP after the first chunk of the request the server started in its slot. Such a view is
// believed only once one prompt's time has passed without an end arriving (doubt, settle, ended); a scrape, the
// server's own count, is believed at once.
//
// A scrape showing more running than the learned slot limit forgets it: the endpoint was restarted with another
// configuration, or something else is sending it requests.
type concurrencyLearner struct {
	// maxRunning is the most requests any scrape, or the EPP's own count of its started requests, has shown running.
	maxRunning int
	// plateauRunning, plateauScrapes and plateauReleases describe the current run of consecutive scrapes with
	// requests waiting and the same running count: the count, how many scrapes, and how many of the EPP's requests
	// there ended meanwhile; plateauScrapes is 0 outside one. releases counts the ends since the last scrape.
	plateauRunning, plateauScrapes, plateauReleases int
	releases                                        int
	queued                                          bool
	// slots is the learned slot limit, 0 while unknown. confirmed reports that a probe confirmed it (it is strict);
	// disproved, that a probe or a scrape once showed the endpoint running more than a learned limit, so that it
	// learns only from the slow plateau rule.
	slots                int
	confirmed, disproved bool
	// perKV is the smoothed running count over KV use: how many requests of the current mix fill the KV cache; 0
	// while unknown.
	perKV float64
	// doubting reports that the EPP's own view says the endpoint runs beyond what it is known to (doubtRunning of its
	// requests started and not ended, or a probe that started with none ended), which an end not yet heard of may
	// explain; it is believed at doubtNs (Unix nanoseconds) unless an end arrives first. doubtConfirms: the probe in
	// doubt waited for a slot, so the end that explains it confirms the limit, as had it arrived in order.
	doubting, doubtConfirms bool
	doubtNs                 int64
	doubtRunning            int
}

const (
	// slotPlateauScrapes and slotPlateauReleases are how long a plateau must last for its running count to be the
	// endpoint's slot limit: four scrapes (150 ms at the default 50 ms interval), across at least two ends of requests
	// there. A server that runs all it can admits a waiting request whenever one ends, so its count holds across the
	// ends; one whose steps are long (a prompt of thousands of tokens on a slow GPU takes a second) holds its count
	// while no step ends, nothing ends either, and at the next step its count moves with what that step admitted.
	slotPlateauScrapes  = 4
	slotPlateauReleases = 1
	// fastPlateauScrapes is how long a small endpoint's plateau must last for its running count to be its tentative
	// slot limit: two scrapes, the first that shows a queue and the next, so that a queue that comes and goes within a
	// step (a request sent just before the step waits for it) rarely counts.
	fastPlateauScrapes = 2
	// kvQueueUsage is the KV cache use at or above which requests waiting there wait for KV blocks, not for a slot: a
	// KV-bound server runs fewer or more requests as their lengths vary, so its running count is no slot limit.
	kvQueueUsage = 0.8
	// perKVWeight is the weight of each scrape in the smoothed requests per KV cache: about the last ten scrapes
	// (half a second at the default interval) count, so one scrape in a step that admitted a batch of prompts moves
	// it little.
	perKVWeight = 0.1
)

// observe folds one new scrape into what is learned; decoding is how many of the EPP's requests there have had their
// first response chunk.
func (l *concurrencyLearner) observe(e Endpoint, decoding int) {
	if e.Running > l.maxRunning {
		l.maxRunning = e.Running
	}
	if e.WaitingQueue > 0 && e.Running > 0 {
		l.queued = true
	}
	if l.slots > 0 && e.Running > l.slots {
		l.forget()
	}
	// A plateau goes on while the running count holds; the scrape that finds the queue gone still counts when the
	// count held, since what ended meanwhile let the waiting requests in, one for one.
	switch {
	case l.plateauScrapes > 0 && e.Running == l.plateauRunning:
		l.plateauScrapes++
		l.plateauReleases += l.releases
	case e.WaitingQueue > 0 && e.Running > 0:
		l.plateauRunning, l.plateauScrapes, l.plateauReleases = e.Running, 1, 0
	default:
		l.plateauRunning, l.plateauScrapes, l.plateauReleases = 0, 0, 0
	}
	l.releases = 0
	fast := !l.disproved && e.WaitingQueue > 0 && e.KVCacheUsage < kvQueueUsage && decoding >= l.plateauRunning &&
		l.plateauRunning < largeBatchRunning && l.plateauScrapes >= fastPlateauScrapes
	slow := e.KVCacheUsage < kvQueueUsage && l.plateauScrapes >= slotPlateauScrapes &&
		l.plateauReleases >= slotPlateauReleases
	if (fast || slow) && l.plateauRunning >= l.maxRunning && l.plateauRunning != l.slots {
		l.slots, l.confirmed = l.plateauRunning, false
	}
	if e.WaitingQueue == 0 {
		l.plateauRunning, l.plateauScrapes, l.plateauReleases = 0, 0, 0
	}
	if e.Running > 0 && e.KVCacheUsage > 0 {
		perKV := float64(e.Running) / e.KVCacheUsage
		if l.perKV == 0 {
			l.perKV = perKV
		} else {
			l.perKV += perKVWeight * (perKV - l.perKV)
		}
	}
}

// limits returns the endpoint's seats, the number of requests it is known to start at once (0 while nothing is
// known), and its capacity, the most requests admission keeps there (0 for no bound), given whether its latest scrape
// showed requests waiting there. A stated concurrency or a learned slot limit, bounded by the KV limit, gives both.
// Without either, an endpoint that has queued requests while running fewer than largeBatchRunning gets tentative
// seats: the most it has run, and a capacity a quarter beyond (at least one request), so its load can grow while it
// starts what it is sent, but a full server queues at most that many while its plateau teaches its slot limit; one
// whose latest scrape showed requests waiting gets nothing beyond its seats until they have started, and none gets a
// capacity beyond what its KV cache holds of the current mix (perKV) when that is more than its seats. Any other
// endpoint has neither (the saturation thresholds alone judge it, as before seats).
func (l *concurrencyLearner) limits(th EndpointThresholds, waiting bool) (seats, capacity int, source concurrencySource) {
	pick := func(n int, s concurrencySource) {
		if n > 0 && (seats == 0 || n < seats) {
			seats, source = n, s
		}
	}
	pick(th.Concurrency, concurrencyStated)
	pick(l.slots, concurrencySlots)
	if seats > 0 {
		if l.perKV > 0 {
			pick(max(1, int(math.Min(th.KVCacheUtil*l.perKV, math.MaxInt32))), concurrencyKV)
		}
		return seats, seats, source
	}
	if !l.queued || l.maxRunning == 0 || l.maxRunning >= largeBatchRunning {
		return 0, 0, concurrencyUnknown
	}
	seats, capacity = l.maxRunning, l.maxRunning+max(1, l.maxRunning/4)
	if waiting {
		capacity = seats
	}
	// Beyond what its KV cache holds a request waits there for blocks, and takes the next that free ahead of any
	// Critical request sent after it.
	if l.perKV > 0 {
		capacity = min(capacity, max(seats, int(math.Min(l.perKV, math.MaxInt32))))
	}
	return seats, capacity, concurrencyRunning
}

// largeBatchRunning: an endpoint seen running at least this many requests at once, whose slot limit is not known,
// gets no tentative seats. Its requests contend in prefill long before it runs out of slots, and a request that
// does wait for a slot there waits for the first of many to end; capping it at what it has run so far while its
// load grows would cost throughput (measured in testbed/bench/scenarios/README.md, "Seats").
const largeBatchRunning = 16

// known is the limit outside the Critical reserve: the stated concurrency or the learned slot limit, the smaller if
// both; 0 while neither is known. A learned limit not yet confirmed is one more while the latest scrape showed
// nothing waiting there: a plateau can be the EPP's own doing (a large server fed one request per request that ends,
// each waiting for the next step) and a limit that is never exceeded would never be disproved, so the endpoint may
// run one more (the probe), which forgets the limit if it starts at once and confirms it if it waits for a slot (below
// stepBoundRunning: confirmable).
func (l *concurrencyLearner) known(th EndpointThresholds, waiting bool) int {
	slots := l.slots
	if l.probing(waiting) {
		slots++
	}
	switch {
	case th.Concurrency > 0 && slots > 0:
		return min(th.Concurrency, slots)
	case th.Concurrency > 0:
		return th.Concurrency
	default:
		return slots
	}
}

// probing reports whether the endpoint may run one request beyond its learned slot limit: the limit is not yet
// confirmed and the latest scrape showed nothing waiting there.
func (l *concurrencyLearner) probing(waiting bool) bool {
	return l.slots > 0 && !l.confirmed && !waiting
}

// observeRunning notes at nowNs that n requests the EPP sent have started there and not ended: unless an end arrives
// before deadlineNs, the endpoint runs at least n, which forgets a smaller learned limit.
func (l *concurrencyLearner) observeRunning(n int, nowNs, deadlineNs int64) {
	if n > l.maxRunning {
		l.doubt(n, nowNs, deadlineNs)
	}
}

// probeStarted folds in the first chunk, at nowNs, of a request sent beyond the learned slot limit (a probe): it
// started after one of the EPP's requests there ended and after waiting longer than a prompt takes there
// (waitedForSlot), which confirms the limit; or it started with none ended (endedSince false), which disproves it
// unless an end arrives before deadlineNs. Anything else says nothing: a request ended just as the probe was sent,
// and it started at once.
func (l *concurrencyLearner) probeStarted(endedSince, waitedForSlot bool, nowNs, deadlineNs int64) {
	switch {
	case l.slots == 0:
	case !endedSince:
		l.doubtConfirms = l.doubtConfirms || waitedForSlot
		l.doubt(0, nowNs, deadlineNs)
	case waitedForSlot:
		l.confirmed = l.confirmable()
	}
}

// confirmable reports whether a probe that waited for a slot confirms the learned limit: below stepBoundRunning, where
// slots free less often than steps end, so that a wait beyond a prompt's time is a wait for a slot.
func (l *concurrencyLearner) confirmable() bool {
	return l.slots > 0 && l.slots < stepBoundRunning
}

// stepBoundRunning: an endpoint whose learned slot limit is at least this many requests frees a slot about every step
// (each of its requests decodes for as many steps as its answer has tokens, and this many of them end that often), so
// that a probe's wait there is a wait for a step whether the limit is real or not; its limit is never confirmed. Above
// the slot-limited servers of a few dozen slots whose limit a probe does confirm: left tentative there, a request
// probing it waits for a slot inside the server ahead of admission's order (measured in
// testbed/bench/scenarios/README.md, "A step-bound server's slot limit").
const stepBoundRunning = 64

// doubt notes at nowNs that the EPP's own view says the endpoint runs beyond what it is known to, running requests (0:
// no more than it has run); settle believes it from deadlineNs on, at once if that is not after nowNs.
func (l *concurrencyLearner) doubt(running int, nowNs, deadlineNs int64) {
	if !l.doubting {
		l.doubting, l.doubtNs = true, deadlineNs
	}
	l.doubtRunning = max(l.doubtRunning, running)
	l.settle(nowNs)
}

// settle believes at nowNs a doubt no end has explained by its deadline: the endpoint ran what the EPP counted, and a
// learned limit is forgotten.
func (l *concurrencyLearner) settle(nowNs int64) {
	if !l.doubting || nowNs < l.doubtNs {
		return
	}
	l.maxRunning = max(l.maxRunning, l.doubtRunning)
	if l.slots > 0 {
		l.forget()
	}
	l.doubting, l.doubtConfirms, l.doubtRunning = false, false, 0
}

// ended notes at nowNs the end of a request there (one of the EPP's or a peer's), running of the EPP's still started
// there: it explains a doubt not yet believed (and confirms the limit if the probe in doubt waited for a slot), unless
// the EPP still counts more running than the endpoint has run.
func (l *concurrencyLearner) ended(nowNs int64, running int) {
	l.settle(nowNs)
	switch {
	case !l.doubting:
	case running > l.maxRunning:
		l.doubtRunning = running
	default:
		l.confirmed = l.confirmed || (l.doubtConfirms && l.confirmable())
		l.doubting, l.doubtConfirms, l.doubtRunning = false, false, 0
	}
}

// forget drops a learned slot limit the endpoint has been seen to exceed; from then on it learns one only from the
// slow plateau rule.
func (l *concurrencyLearner) forget() {
	l.slots, l.confirmed, l.disproved = 0, false, true
}

// concurrencySource says where an endpoint's concurrency comes from. It is a closed enum.
type concurrencySource uint8

const (
	// concurrencyUnknown: nothing is known yet (no request has been seen running).
	concurrencyUnknown concurrencySource = iota
	// concurrencyRunning: the most it has run at once, while the limit is not known.
	concurrencyRunning
	// concurrencyStated: the policy's endpoint.concurrency.
	concurrencyStated
	// concurrencySlots: the running count the endpoint plateaus at while requests wait there.
	concurrencySlots
	// concurrencyKV: what its KV cache holds of the current mix.
	concurrencyKV
)

// numConcurrencySources is the number of concurrencySource values.
const numConcurrencySources = 5

var concurrencySourceNames = [numConcurrencySources]string{"unknown", "running", "stated", "slots", "kv"}

// String returns the source's metric label value.
func (s concurrencySource) String() string {
	if int(s) < len(concurrencySourceNames) {
		return concurrencySourceNames[s]
	}
	return fmt.Sprintf("concurrencySource(%d)", uint8(s))
}
