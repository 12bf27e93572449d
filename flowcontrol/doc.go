// Package flowcontrol decides when an inference request may leave the EPP for the scheduler: priority bands with
// queued admission, fair sharing between tenants, and explicit load shedding with a computed Retry-After.
//
// It is pure decision logic: plain inputs (Request, Endpoint snapshots, Config), an injected clock and random source,
// no I/O, and no dependency on the Gateway API Inference Extension. plugins/ adapts it to upstream's
// requestcontrol.AdmissionController; the gRPC layer maps its outcomes to HTTP.
//
// # Algorithm
//
// A request's InferenceObjective priority maps to a Band (Critical, Standard, Sheddable), lowered to its tenant's
// cap if it asks for more, or, when the policy says so (Config.AboveMaxBand), rejected with ReasonBandNotAllowed. The
// tenant is whatever the caller puts in Request.Tenant; Config.TenantHeader tells the caller which request header
// to read it from (a header an authenticating gateway sets, when tenants' caps must hold against their clients). An endpoint's saturation is the largest of its waiting queue plus the requests the EPP sent
// it since its last scrape over the queue-depth threshold, its KV-cache use over the KV threshold, optionally its
// running count over a running threshold, and the time of its pending prompts over the pending time threshold. An
// endpoint has headroom for a band when its metrics are fresh, no outlier filter ejects it (Endpoint.Ejected: an
// ejected endpoint offers no headroom, idle seat or rank, yet counts as fresh so an ejection never makes the pool look
// down), it has a free slot (see Seats and "Foreign load does not close an endpoint" below) and its saturation is below
// the band's ceiling; while the Critical reserve is on, lower bands also leave the reserved idle seats alone.
//
// Pending prompts are the streamed requests the EPP sent an endpoint that have not had their first response chunk
// (Request.Streamed, Started); each costs the endpoint's learned first-chunk time, so a slow endpoint fills with
// fewer. A scrape shows such a request as running once the server schedules it, yet until its first token its prompt
// is computed in the endpoint's next steps, and any prompt sent there meanwhile shares those steps: with continuous
// batching, time to first token under load is mostly the other prompts in one's first step.
//
// The burst tier: when no endpoint has headroom for a band that queues when saturated, and no Critical traffic is
// active, the band may dispatch to endpoints judged by deeper thresholds (the burst queue depth and pending time). A
// burst above the pool's capacity drains faster when each server computes several prompts per step than when it is
// fed one or two at a time; below capacity some endpoint always has normal headroom and prompts stay apart.
//
// The Critical reserve: while Critical traffic is active (a Critical request arrived within the drain-rate window),
// no band uses the burst tier, so endpoints drain to their normal thresholds and Critical, first in line, takes the
// next normal place that frees up rather than a step shared with a full batch; if set, an endpoint's pending prompts
// also count over the pending threshold (a count cap). The reserve governs this controller only: another EPP replica
// that sees no Critical traffic still uses the burst tier. Replicas that own shares of a pool and exchange summaries
// (package replication) size the seat reserve for the whole pool and each keep their part of it, and a Critical
// request that would wait on one replica's endpoints may take an idle seat of a peer's (peers.go, Peers). With a live
// peer, an endpoint whose own slot limit is not known counts the pool's slot limit as its seats (seatsLocked), and a
// Critical request that finds no seat to start at once waits, first in line, rather than join a server's queue when
// every candidate holds the pool's slot limit. A replica also tells its peers what its tenants ask and what it drains
// (Controller.Demand, every few summaries), including whether an endpoint of its own is not seat-bound (the rate its
// seats free is then a floor of what the pool drains, not a figure of it), and with the peers' (Peers.Demand) judges a
// tenant under its share over the pool (tenantRatesLocked, poolDrainLocked): tenant seats, the dispatch order and the yield rule then follow the
// pool's figures, not this replica's share of the traffic. The seats kept for tenants under their share are then sized
// for the pool, as the seat reserve is, and each replica keeps its part of them (underShareSeatsLocked) and offers
// it to such a tenant's requests waiting at a peer. With no peer's demand it judges on its own, as before.
//
// Seats: a server that runs only a few requests at once (vLLM's --max-num-seqs) queues what it is sent behind the
// requests it runs, FIFO, so on such a server the EPP's priority and fair order is not the order requests start. The
// controller therefore counts every request it sent an endpoint until Release (its own signal that a slot freed,
// fresher than any scrape), learns each endpoint's concurrency (concurrencyLearner: the running count it plateaus at
// while requests wait there, across ends of requests; EndpointThresholds.Concurrency may state it; the KV cache may
// hold fewer, and the smaller applies) and sends an endpoint no more than that, so requests wait in the EPP and the
// next one leaves the moment one ends. An endpoint running only a few requests (fewer than 16) learns its limit from
// two consecutive scrapes showing requests waiting at the most it has run (not on a full KV cache, where they wait
// for blocks); a request that waited there beyond the limit confirms it (it started only after one of the EPP's
// requests there ended) or disproves it (it started with none ended), and until then the endpoint may run one more
// while nothing waits there (a probe, never under the Critical reserve), so a plateau of the EPP's own making is
// found out. A confirmed limit is strict; a disproved one is learned again only from the slow plateau rule. The EPP's
// own evidence (a request that started with none ended, more of its requests running than the endpoint has run) is
// believed only once one prompt's time passes without an end arriving: the end of a response can reach the EPP after
// the first chunk of the request the server started in its slot; a scrape showing more running is believed at once.
// Under the
// Critical reserve, an endpoint that has queued while running only a few requests gets tentative seats (the most it
// has run) until its plateau is learned, and lower bands leave idle a
// reserve of seats on the endpoints that have been full recently, sized from the observed Critical arrival rate and
// the rate seats free, as Kubernetes API Priority and Fairness keeps seats for a priority level (seats.go): a Critical
// arrival finds one free rather than waiting for a running request to end. No scrape shows a limit before a request
// waits there, and that request takes the first slot to free there ahead of Critical; so under the reserve a lower
// band sends an endpoint whose own limit is not known, and that never ran more, no more than the smallest slot limit
// learned in the pool (Critical may go beyond it, and shows it wrong if it starts at once). In the warm-up (no request
// has ended on a seat-bound endpoint yet, so nothing frees) and once the pool has a slot limit, a lower band under the
// reserve also goes beyond no endpoint's tentative seats while the reserve's idle seats are short: only Critical grows
// an endpoint then, so the places beyond the seats are left for the Critical arrivals of the warm-up (headroom.go,
// warmUpGrowthLocked). Under the reserve in such a pool a lower band also sends an endpoint of unknown limit that has
// run more than the pool's limit and has no tentative seats no further than the most it has run (beyondMostRunLocked):
// Critical alone grows it. Schedulers rank a KV-bound
// endpoint by the seats its KV cache has room for, so requests go where they start at once. A tenant under its share
// (tenantseats.go; its share is of what the band drains, from the rate the seats of every seat-bound endpoint not down
// free, whether or not its latest scrape is fresh) is served as Critical is under its reserve: first in its band,
// seats kept for it, and headroom judged by seats rather than by the band's ceiling on KV use; meanwhile no request of its band goes beyond an
// endpoint's capacity (no probe, no burst into a server's queue) or, where the endpoint's own limit is not known,
// beyond the pool's slot limit, nor, on a large endpoint of unknown limit in a pool with one and without live peers,
// beyond the most it has run while its latest scrape shows requests waiting there, so the first places to free go to
// it. In a pool with a slot limit and without live peers, no request goes beyond the tentative seats of an endpoint
// whose latest scrape shows requests waiting (queuedBeyondSeatsLocked). Large-batch servers, whose requests contend
// in prefill long before they run out of slots, keep the saturation thresholds alone until a plateau is seen.
// Each scrape is reconciled with the EPP's count (occupancyRecon): requests sent around the EPP count as occupancy,
// and requests whose end was never reported stop counting after three scrapes.
//
// KV room at final size (kvroom.go): on an endpoint whose KV capacity the EPP has learned (in tokens, from scrapes
// showing only its own requests at half its KV cache or more) and whose run time it knows, each of its requests counts
// at its size at the moment (its prompt, growing linearly into its expected output, Request.OutputTokens, over the run
// time from its first chunk). While protected requests are about and the pool is saturated (a request below Critical
// waits in the EPP), an unprotected one goes only where
// every request there fits at its final size, so it never takes the blocks the running requests grow into; below
// saturation (a recovery after an overload) it takes what the seats allow, as without KV room. A protected one goes
// among the endpoints with headroom to those where its prompt fits now and it keeps its blocks to its end, else where
// it fits now. With live peers a replica counts the requests its peers sent to its endpoints at the final sizes they
// tell, and a protected request of a band that queues, with no endpoint of room for its prompt, waits here for one or
// for a peer's place offered with room, and the bands below it wait with it.
//
// Foreign load does not close an endpoint: an endpoint on which the EPP has none of its own requests in flight always
// takes one, whatever its seats and the foreign occupancy its scrapes show (endpointState.hasSlot). Load the EPP did
// not cause (another EPP replica's, a second gateway's, a server reporting a steady queue) is not drained by the EPP
// waiting, since whoever sent it refills the seats it frees; counting it in full would close the endpoint to this
// EPP for as long as it lasts, and its requests would wait out their queue time. With the floor the EPP keeps one
// request at a time there, in its own priority and fair order, starting behind whatever the server already queues,
// and beyond that one its requests are bounded by the seats with the foreign load counted against them. A floor of
// one, rather than seats that grow with the foreign load, keeps the server's queue as short as this EPP can make it;
// a saturation ceiling still applies as before (headroom).
//
// On arrival, if any endpoint has headroom for the band (and, therefore, nothing waits ahead), the request is
// dispatched at once: the fast path takes one lock, scans the endpoints and allocates only the list of endpoints with
// headroom it hands to the scheduler. Otherwise, in order: a band that rejects when saturated (by default Sheddable,
// the holdback band) rejects, unless the request is a client's return it promised capacity to (below); a request
// whose predicted wait exceeds the band's maximum queue time is rejected; a full band rejects; a full controller lets
// a band allowed to displace evict the newest requests of the lowest lower band; else the request waits.
//
// A tenant that shares its band's drain with others (not under its share, and another tenant of the band waits or is
// under its share) is predicted to wait no less than its own waiting cost over its own drain: the cost dispatched from
// it per second of the time it had requests waiting (tenantdrain.go). The pool's drain rate alone overstates what a
// heavy tenant gets by what the others take, so its excess was admitted and answered only at its deadline. A waiting
// request that the same prediction, kept up to date, puts after its deadline is answered 429 (ReasonPredictedWait,
// with Retry-After) at once, checked at most every 100 ms on a scrape, rather than at the deadline. Such a tenant's
// deadline is also shorter: BandConfig.OverShareMaxQueueTime (by default a third of the default MaxQueueTime) bounds
// its predicted wait on arrival and while it waits, so a heavy tenant's excess is answered 429 + Retry-After rather than held for
// the band's full MaxQueueTime (and, under a long overload, left waiting when its clients give up); in a pool with a
// slot limit, a request queued while its tenant was under its share keeps its MaxQueueTime. A band's only tenant is
// predicted as before.
//
// Late metrics are not a down pool. When no endpoint's metrics are fresh but one was scraped within ten staleness
// thresholds (2 s by default), a band that queues waits for the next scrape as it would for headroom (a scrape late
// because the EPP or a server was starved of CPU for a moment is not a reason to turn traffic away), and a band that
// rejects when saturated, which cannot tell, gets Unavailable. With no endpoint scraped for that long, every arrival
// and every waiting request is answered Unavailable (ReasonNoEndpoints).
//
// Waiting requests leave in order whenever an event creates headroom (a scrape, a Release, a Bind, a Started, the end
// of the Critical reserve): bands strictly by priority, and within a band by start-time fair queuing across tenants,
// weighted by policy and charged by estimated cost (tokens), FIFO per tenant; a tenant below its share may start up
// to a few requests ahead of the band's virtual time, so requests it sends together start before a backlogged
// tenant's rather than alternating with them (fairqueue.go). Dispatch is per endpoint: one idle
// endpoint is enough for the head of the highest non-empty band to go, whatever the pool's average saturation.
//
// A dispatched request is reserved on the least saturated endpoint with headroom until the scheduler's choice moves it
// (Bind) and counted there until the request finishes (Release). It counts towards the endpoint's queue until a
// scrape taken after it covers it (UpdateEndpoints) and, if streamed, it has started; that keeps a burst between two
// scrapes from piling onto one endpoint. It counts towards the endpoint's occupancy (seats) until Release.
//
// Retry-After is the estimated time until capacity for the band returns (shed.go, recovery.go). Outside an overload
// episode it is the backlog at and above the band over the drain rate (an exponential moving average of cost
// dispatched per second of backlogged time). While the band is blocked (snapshots finding no headroom for it, or
// requests waiting at or above it), it follows that backlog's trend:
//
//   - Growing or standing, the overload goes on: an episode that has lasted d is taken to last about d more (the
//     backlog term alone would tell shed Sheddable clients "1s" all through a burst, which sheds them again), and the
//     backlog it leaves then takes as long to drain as it took to build (the load after an overload is taken to be
//     as far below capacity as it was above), never less than the drain rate allows.
//   - Shrinking, the overload is over: the backlog drains at the rate it is seen to shrink, which counts the arrivals
//     that keep joining it; over the drain rate alone, clients came back while it still shed them. A built-up
//     backlog that has drained ends the episode.
//
// The estimate is clamped to the band's bounds, rounded up to whole seconds and spread by the jitter, only ever later:
// a client sent back before the estimate returns while capacity is still expected to be short. Finally a ledger of
// returns (promises.go) books each answer in the first second at or after it whose returns stay within the drain
// rate, so that clients told during an overload's drain do not all come back in the second it ends.
//
// The EPP cannot know how long an overload will last, so clients turned away early in one are told too short a wait
// and come back while the backlog it left still drains. A band that rejects when saturated therefore keeps its
// promises: it remembers when each request it turned away was told to come back, by a key its caller derives from
// the request's content (Request.ReturnKey; the EPP hashes tenant and body, which a retrying client sends again), and
// lets a request that claims one at or after that moment wait in its queue, ahead of later arrivals of the band (which
// are still turned away while anything of it waits), up to the band's MaxQueueTime, once the overload is over (the
// backlog at and above the band drains; during it the band is what keeps the load off the others, and sheds the
// return again); or, with no backlog standing at and above the band (it is blocked by the servers' saturation alone),
// once the servers' own load (running and waiting, per fresh endpoint) falls so fast that at its trend it
// would be gone within the band's MaxQueueTime (loadFallingLocked). A client cannot forge a promise: only a request
// turned away earns one, only its own content claims it, and only once (promises.go; measured in testbed/bench/scenarios/README.md, overload-recovery). Promises are kept
// by each replica, not exchanged with its peers: a return that the proxy sends to another replica is a new arrival
// there. Each band's promises are bounded as a whole, not per tenant, so one tenant turned away with many distinct
// bodies can fill them, and later refusals then keep no promise until entries expire.
//
// A band that queues, below Critical, keeps promises too: a client that comes back more than a second before the
// moment it was told, and would wait, is answered 429 at once with the time left (ReasonEarlyReturn; a client that caps its wait below
// the Retry-After it was told), unless its tenant is under its share. Without this, the returns an overload's end
// leaves queue behind its backlog and are still waiting when the load ends. The key is the content, so another client
// of the tenant sending the same body (a load test's fixed body) before that moment, and that would wait, is told the
// same; used up at the first return, the promise would let a client that caps its wait twice queue behind the
// backlog again (measured: testbed/bench/scenarios/README.md, "Early returns
// told the rest of their wait"). Not at one of several replicas (Deps.Replica), which knows only its own refusals.
//
// # Invariants
//
//   - Every Admit call ends in exactly one Decision: Dispatched, Rejected (with a Reason), Unavailable, or Cancelled.
//     A request is finalized once under the lock; finalizing twice panics. Every Submit call gets exactly one
//     callback with that Decision.
//   - A non-empty band has no endpoint with headroom for it. Ceilings never increase from Critical to Sheddable, so
//     a lower band never overtakes a higher one.
//   - Every time limit is a clock event: waiting requests expire through a timer on the injected clock, never through
//     context deadlines. A cancelled context removes its waiting request.
//   - Waiting counts and bytes never exceed the band's and the controller's capacities.
//   - During shutdown nothing new is admitted; waiting requests are dispatched until the grace period ends, and the
//     rest are answered Unavailable.
//
// # Live reconfiguration
//
// SetConfig puts a new validated Config in force without a restart. Arrivals are decided entirely by it. Requests
// already waiting keep their admission and band, are dispatched by the new ceilings and endpoint thresholds, and get
// the new maximum queue time of their band measured from their arrival (so some may be answered at once); lowered
// capacities evict nobody but refuse arrivals until the queue is back under them.
//
// # Concurrency
//
// A Controller is safe for concurrent use. One mutex guards all state; a method whose name ends in "Locked" expects it
// held and returns with it held; the Controller's other methods take it themselves, except dispatchFreedAndUnlock,
// which is entered with it held and releases it. The types it guards (bandQueue, endpointState, drainEstimator) own no
// lock. Admit blocks its caller on a per-request channel, never while holding the lock. Clock callbacks only start a
// goroutine (fake clocks run callbacks under their own lock), unless Deps.SynchronousTimers asks for them to run
// inline. The Recorder is called outside the lock, except for the decision of a request that waited after Submit.
//
// Submit is the non-blocking entry point for callers that drive the controller, the clock and the model servers from
// one goroutine (virtual-time benchmarks): a waiting request's callback runs inside the call that decides it, under
// the lock, so the callback must not call the Controller. With SynchronousTimers and a clock that runs callbacks on
// the caller's goroutine, the controller starts no goroutine at all and its decisions are a deterministic function of
// the calls made and the seeded Rand.
package flowcontrol
