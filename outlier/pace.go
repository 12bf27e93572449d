package outlier

import (
	"math/bits"
	"slices"
	"sync"
	"time"
)

// Pace finds the endpoints that became slow, from the pace of their streamed responses, and ejects them through
// its Detector (ObserveSlow). A gap is the time between two chunks of one stream; a slow gap is at least SlowFactor
// times the endpoint's usual gap. An endpoint is slow, while most of the other endpoints streaming are at their
// normal pace, when all of its streams stall with nothing it was sent to explain it (below), or when SlowGaps of the
// last 2·SlowGaps-1 gaps of one of its streams were slow (the median of its recent gaps is).
//
// Why the gap between chunks: a model server streams a chunk per token, one per engine step, so the gap is the
// server's step time. It does not grow with the server's queue, as the time to the first chunk does, nor with the
// request's own prompt, computed before its first chunk. Why the endpoint's own usual gap rather than its peers':
// a pool of mixed GPUs holds servers 3x apart in step time by design; a server several times slower than itself
// is not normal. Why most peers at their normal pace: when the whole pool slows down together (a burst of long
// prompts, more load, a pause of the EPP or the proxy that carries the chunks), none of them is the outlier. A peer
// is not at its normal pace either when it was quiet (nothing for quietGaps of its usual gaps) over at least half
// of the silence judged, even if its chunks have arrived since: on a starved host the EPP, the proxy and the servers
// pause together, and the chunks held back arrive in a burst afterwards, in any order, so the endpoint whose chunk
// is delivered last looks like the only one silent.
//
// A stall: an endpoint with streams under way that sends nothing for SlowFactor times its usual gap. On a healthy
// server only a prefill makes a step that long (or a pause of its process, which a stall cannot tell apart, or the
// load of a LoRA adapter), and a prefill is of a prompt the EPP sent there, a load for a request it sent there:
// Dispatch records each request sent to the endpoint with its prompt's length and whether it may load an adapter,
// and the endpoint may be computing prefills until prefillUntil, each prompt taking at most its tokens at
// prefillTokensPerStep per usual gap, and adapterLoadGaps usual gaps more for a load, one after the other
// from its dispatch, or, for the oldest request still waiting for its first chunk, from the next end of a stream
// there (a slot-limited server starts a waiting request when a running one ends). A silence of SlowFactor usual
// gaps counted from the later of the latest chunk and prefillUntil is unexplained: the endpoint is slow at once, at
// the pick or admission snapshot that sees it (Stalled), or at the chunk that ends it, before the slowed server's
// first slow chunk arrives. Prompts the EPP did not send explain a silence too, as far as it can know them: each
// request an endpoint's new scrape shows beyond the EPP's own there (a peer replica's, whose prompts it never sees)
// counts as a prompt of the mean length dispatched, sent then (Scraped).
//
// The window of a stream's gaps judges a slowed server whose silences stay explained (long prompts keep arriving
// there), as it did before stalls were judged. Why several gaps, and the median of a stream's recent gaps rather
// than a run of slow ones: a step that computes another request's long prompt delays every stream of the batch
// once, while a slowed server delays every step; and a chunk delayed on its way (a busy proxy, a busy EPP) makes one
// gap long and the next one short, which must not reset the count. A gap is judged less the prefills that may have
// started there since the stream's chunk before its previous one (the prompts sent there, and the oldest waiting
// one at each end of a stream), at the slowest rate: a large batch under load starts a prefill or two in most of its
// steps, so every gap of every stream is several usual gaps long, and only the work sent there tells it from a
// slowed server, which computes those prompts slower too. Only the prompts sent during the gap and the one before
// count (the step after a dispatch computes it), not a long prompt sent earlier: that one delays the batch once.
//
// The usual gap is the mean of the endpoint's normal gaps (below SlowFactor times it, on streams with no slow gap
// in their window) over about the last paceMemory of them, judged from paceWarmup on. Slow gaps do not move it, so a
// slow-down does not become the server's normal while it lasts. A stream one slow gap short of its window's count
// that has sent nothing for SlowFactor times the usual gap counts the gap under way as slow at a pick (Stalled).
// Once reported, an endpoint is on probation until a stream of it has a whole window of normal gaps: meanwhile one
// slow gap or stall reports it again (the Detector ejects it again if its ejection is over), as one 5xx after a
// 5xx ejection does.
//
// Non-streamed responses give no gaps: one chunk, at the end. A Pace is safe for concurrent use; one mutex guards
// it, taken before the Detector's.
type Pace struct {
	d      *Detector
	factor float64
	gaps   int

	mu sync.Mutex
	// ejectOnStall is the stall rule in force: the Detector's EjectOnStall until SetEjectOnStall.
	ejectOnStall bool
	// promptTokens is the running mean of the prompts dispatched (Dispatch), over about the last paceMemory: the
	// length a request another sender sent counts as (Scraped).
	promptTokens float64
	prompts      int
	// streams holds the streams under way by request ID, from their first chunk to End (or to streamIdle
	// without a chunk).
	streams map[string]*stream
	// suspects are the streams one slow gap short of slow: the streams a stall makes slow.
	suspects map[*stream]struct{}
	// endpoints holds each endpoint's pace, until it sends nothing for paceIdle.
	endpoints  map[string]*endpointPace
	lastPruned time.Time
}

const (
	// paceWarmup is how many gaps an endpoint's usual gap is learnt from before gaps are judged by it.
	paceWarmup = 32
	// paceMemory is the horizon, in gaps, of the usual gap's running mean: long enough that a few hundred
	// milliseconds of a slowed server's gaps could not move it much if they counted, short enough to follow the
	// slow drift of a server's load.
	paceMemory = 256
	// streamIdle forgets a stream whose end was never reported: far beyond any gap between two tokens.
	streamIdle = 5 * time.Minute
	// paceIdle forgets the pace of an endpoint that sent nothing for so long that it probably left the pool; if it
	// had not, it learns its usual gap again.
	paceIdle = 10 * time.Minute
	// prefillTokensPerStep is the fewest prompt tokens a server computes in the time of one decode step (its usual
	// gap), of the GPU classes known: an A10G computes about 70 (18 ms step, 4k tokens/s), an H100 about 150 (6 ms,
	// 25k tokens/s). A prompt of T tokens delays the endpoint's streams by at most T/prefillTokensPerStep usual gaps.
	prefillTokensPerStep = 64
	// adapterLoadGaps is the most usual gaps loading a LoRA adapter adds to the step that admits a request for it
	// (vLLM loads adapters inside the engine step, so every stream of the batch waits): the test bed's H100-like
	// server loads one in 25 ms (4 steps of 6 ms), its A10G-like one in 60 ms (3.3 steps of 18 ms). A request that
	// may load one counts as adapterLoadGaps·prefillTokensPerStep more prompt tokens.
	adapterLoadGaps = 4
	// stallHorizon bounds how long a silence counts as a stall: a stream whose end was never reported is silent
	// for ever, and an endpoint that slowed down sends its slow chunks well within it.
	stallHorizon = 2 * time.Second
	// quietGaps is the silence, in usual gaps, that makes a peer quiet: twice what a healthy server streaming at its
	// pace leaves between two chunks, well short of a stall (SlowFactor), so that a pause that hit the whole pool
	// counts against every peer it held back, not only the ones it held back as long.
	quietGaps = 2
)

type stream struct {
	endpoint string
	last     time.Time // latest chunk, or the dispatch while pending
	// pending: dispatched (Dispatch) and no chunk yet, its prompt of tokens (estimated) waiting for or in prefill.
	pending bool
	tokens  int
	// explainFrom is its endpoint's prefilled count (endpointPace.prefilled) at the chunk before its latest one
	// (at its first chunk, at that chunk): the prompts counted since may explain its gap under way (see Pace).
	// explainNext is the count at its latest chunk.
	explainFrom, explainNext int64
	// history holds whether each of the stream's last gaps was slow, the latest in bit 0.
	history uint64
	judged  int // gaps judged, up to the window's length
}

type endpointPace struct {
	usual    time.Duration // mean of the normal gaps
	n        int           // gaps learnt, up to paceMemory
	last     time.Time     // latest chunk
	normalAt time.Time     // latest normal gap
	slowAt   time.Time     // latest slow gap
	// reported: reported slow to the detector and not cleared since by a window of normal gaps: on probation, one
	// slow gap (or stall) reports it again, as the first 5xx after an ejection does.
	reported bool
	suspects int // streams of it among the suspects
	open     int // streams under way: a chunk seen, not ended
	// queue holds the requests dispatched to it and not streaming yet (pending), oldest first: waiting for a slot,
	// or in prefill.
	queue []*stream
	// prefillUntil is when the prefills it may be computing end, at the slowest rate (prefillTokensPerStep): its
	// streams' silence counts from then.
	prefillUntil time.Time
	// prefilled counts the prompt tokens whose prefill may have started there: each prompt sent there, and the
	// oldest waiting one again at each end of a stream (prefill).
	prefilled int64
	// scrapedAt is the time of the latest scrape Scraped counted.
	scrapedAt time.Time
	// quietFrom and quietTo bound its latest quiet spell: quietGaps usual gaps or more between two of its chunks, a
	// stream of it under way.
	quietFrom, quietTo time.Time
}

// EndpointEjection is an ejection of Endpoint by its pace, against its Usual gap: by a stall, All of its streams or
// one of them Silent so long; or by a window of slow gaps (Silent 0).
type EndpointEjection struct {
	Endpoint string
	Ejection
	All           bool
	Silent, Usual time.Duration
}

// NewPace returns a Pace that ejects slow endpoints through d, by d's SlowFactor and SlowGaps; with SlowFactor 0
// it judges nothing.
func NewPace(d *Detector) *Pace {
	return &Pace{
		d: d, factor: d.cfg.SlowFactor, gaps: d.cfg.SlowGaps, ejectOnStall: d.cfg.EjectOnStall,
		streams: map[string]*stream{}, suspects: map[*stream]struct{}{}, endpoints: map[string]*endpointPace{},
	}
}

// SetEjectOnStall turns the stall rule on or off from now on (Config.EjectOnStall): an EPP that learns only after its
// plugins are built that prompts it never sees reach its endpoints (replicas with peers) turns it off. The window of
// a stream's slow gaps still judges every endpoint.
func (p *Pace) SetEjectOnStall(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ejectOnStall = on
}

// Dispatch records that request id, of about tokens prompt tokens, was sent to endpoint at now, and whether it may
// load a LoRA adapter there (loadsAdapter): its prefill, and the load, may stall the endpoint's streams for as long
// as its tokens take at the slowest rate plus adapterLoadGaps usual gaps, from now, or, while it waits for its first
// chunk, from the next end of a stream there (see Pace). An empty id or endpoint is ignored.
func (p *Pace) Dispatch(now time.Time, id, endpoint string, tokens int, loadsAdapter bool) {
	if p.factor == 0 || id == "" || endpoint == "" {
		return
	}
	if loadsAdapter {
		tokens = max(tokens, 0) + adapterLoadGaps*prefillTokensPerStep
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pruneLocked(now)
	p.prompts = min(p.prompts+1, paceMemory)
	p.promptTokens += (float64(max(tokens, 0)) - p.promptTokens) / float64(p.prompts)
	if s := p.streams[id]; s != nil {
		p.dropLocked(now, id, s)
	}
	e := p.endpointLocked(endpoint)
	s := &stream{endpoint: endpoint, last: now, pending: true, tokens: tokens}
	p.streams[id] = s
	e.queue = append(e.queue, s)
	e.prefill(now, tokens)
}

// Scraped records, at now, that endpoint's scrape taken at scrapedAt showed inFlight requests there, running or
// waiting. Those beyond the requests this EPP has there (streaming, or sent and not streaming yet) were sent by
// someone else: a peer replica, whose prompts this EPP never sees, or traffic that does not pass through it. At each
// new scrape each of them counts as a prompt of the mean length dispatched here, sent at now: its prefill explains a
// stall of the endpoint's streams as a prompt sent here does, but not the slow gaps of a stream's window (a slowed
// server with others' load there is still ejected by those). An endpoint whose pace is unknown, or a scrape time ahead
// of now (not a scrape's: the test bed shows upstream's staleness check such a time for fresh metrics), is ignored.
func (p *Pace) Scraped(now time.Time, endpoint string, inFlight int, scrapedAt time.Time) {
	if p.factor == 0 || endpoint == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.endpoints[endpoint]
	if e == nil || !scrapedAt.After(e.scrapedAt) || scrapedAt.After(now) {
		return
	}
	e.scrapedAt = scrapedAt
	if others := inFlight - e.open - len(e.queue); others > 0 {
		e.explainUntil(now, others*int(p.promptTokens))
	}
}

// Chunk records a chunk of request id's streamed response, sent by endpoint, at now. When the gap since the
// stream's previous chunk, or the endpoint's silence before it (an unexplained stall: All), ejects the endpoint,
// Chunk returns the ejection; else the zero EndpointEjection. An empty id or endpoint is ignored.
func (p *Pace) Chunk(now time.Time, id, endpoint string) EndpointEjection {
	if p.factor == 0 || id == "" || endpoint == "" {
		return EndpointEjection{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pruneLocked(now)
	e := p.endpointLocked(endpoint)
	stalled, silent, from := p.stalledLocked(e, now), now.Sub(e.last), e.silentSince()
	ej := p.chunkLocked(now, id, endpoint, e, stalled, from)
	if ej.Reason == NotEjected {
		return EndpointEjection{}
	}
	out := EndpointEjection{Endpoint: endpoint, Ejection: ej, All: stalled, Usual: e.usual}
	if stalled {
		out.Silent = silent
	}
	return out
}

// chunkLocked records the chunk of Chunk on e, whose streams had stalled before it, unexplained since from, if
// stalled.
func (p *Pace) chunkLocked(now time.Time, id, endpoint string, e *endpointPace, stalled bool, from time.Time) Ejection {
	if e.open > 0 && e.n >= paceWarmup && now.Sub(e.last) >= quietGaps*e.usual {
		e.quietFrom, e.quietTo = e.last, now
	}
	e.last = now
	s := p.streams[id]
	if s != nil && s.endpoint != endpoint {
		p.dropLocked(now, id, s)
		s = nil
	}
	if s == nil || s.pending {
		if s != nil {
			e.dequeue(s)
		}
		s = &stream{endpoint: endpoint, last: now, explainFrom: e.prefilled, explainNext: e.prefilled}
		p.streams[id] = s
		e.open++
		p.suspectLocked(s)
		return p.stallLocked(now, endpoint, e, stalled, from)
	}
	gap, gapFrom := now.Sub(s.last), s.last
	s.last = now
	if e.n < paceWarmup {
		e.learn(gap)
		s.explainFrom, s.explainNext = s.explainNext, e.prefilled
		return Ejection{}
	}
	slow := p.slowGapLocked(e, s, gap)
	clean := s.history == 0 && !p.slowLocked(e, gap)
	s.explainFrom, s.explainNext = s.explainNext, e.prefilled
	s.history = (s.history<<1 | b2u(slow)) & p.window()
	s.judged = min(s.judged+1, 2*p.gaps-1)
	p.suspectLocked(s)
	if !slow {
		if clean {
			e.learn(gap)
		}
		e.normalAt = now
		// A whole window of normal gaps clears the endpoint's slow record (one short gap may be a delayed chunk's
		// successor on a slowed server).
		if s.history == 0 && s.judged == 2*p.gaps-1 && e.reported && p.d.ObservePaced(now, endpoint) {
			e.reported = false
		}
		return Ejection{}
	}
	e.slowAt = now
	if !e.reported && !stalled && bits.OnesCount64(s.history) < p.gaps {
		return Ejection{}
	}
	if stalled {
		gapFrom = from
	}
	return p.reportLocked(now, endpoint, e, gapFrom)
}

// stallLocked reports endpoint slow when its streams had stalled, unexplained since from, before the chunk at now.
func (p *Pace) stallLocked(now time.Time, endpoint string, e *endpointPace, stalled bool, from time.Time) Ejection {
	if !stalled {
		return Ejection{}
	}
	e.slowAt = now
	return p.reportLocked(now, endpoint, e, from)
}

// endpointLocked returns endpoint's pace, new if unknown.
func (p *Pace) endpointLocked(endpoint string) *endpointPace {
	e := p.endpoints[endpoint]
	if e == nil {
		e = &endpointPace{}
		p.endpoints[endpoint] = e
	}
	return e
}

// prefill extends, at now, the time e may spend computing prefills by a prompt of tokens, at the slowest rate.
func (e *endpointPace) prefill(now time.Time, tokens int) {
	e.prefilled += int64(max(tokens, 0))
	e.explainUntil(now, tokens)
}

// explainUntil extends, at now, the time e's silence is explained (prefillUntil) by prompts of tokens sent by someone
// else, at the slowest rate, without counting them among the prefills that explain a stream's gaps (prefilled).
func (e *endpointPace) explainUntil(now time.Time, tokens int) {
	if e.prefillUntil.Before(now) {
		e.prefillUntil = now
	}
	e.prefillUntil = e.prefillUntil.Add(e.usual * time.Duration(tokens) / prefillTokensPerStep)
}

// dequeue removes s from e's pending requests.
func (e *endpointPace) dequeue(s *stream) {
	if i := slices.Index(e.queue, s); i >= 0 {
		e.queue = slices.Delete(e.queue, i, i+1)
	}
}

// stalledLocked reports whether e's streams stalled, unexplained, at now: it has streams under way and has sent
// nothing for SlowFactor times its usual gap (up to stallHorizon: a stream whose end was never reported is not a
// stall) since its latest chunk or since the prefills it may be computing end, whichever is later (silentSince).
func (p *Pace) stalledLocked(e *endpointPace, now time.Time) bool {
	return p.ejectOnStall && p.silentLocked(e, now) && p.slowLocked(e, now.Sub(e.prefillUntil))
}

// silentSince is when e's silence stopped being explained: its latest chunk or the end of the prefills it may be
// computing, whichever is later.
func (e *endpointPace) silentSince() time.Time {
	if e.prefillUntil.After(e.last) {
		return e.prefillUntil
	}
	return e.last
}

// quietLocked reports whether e was quiet (see endpointPace.quietFrom) over at least half of [from, now]: in its
// latest quiet spell, or in the one under way.
func (p *Pace) quietLocked(e *endpointPace, from, now time.Time) bool {
	if e.n < paceWarmup || !now.After(from) {
		return false
	}
	half := now.Sub(from) / 2
	if e.open > 0 && now.Sub(e.last) >= quietGaps*e.usual && now.Sub(later(e.last, from)) >= half {
		return true
	}
	return e.quietTo.Sub(later(e.quietFrom, from)) >= half
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// silentLocked reports whether e, with streams under way, has sent nothing for SlowFactor times its usual gap (up
// to stallHorizon) at now.
func (p *Pace) silentLocked(e *endpointPace, now time.Time) bool {
	quiet := now.Sub(e.last)
	return e.n >= paceWarmup && e.open > 0 && p.slowLocked(e, quiet) && quiet <= stallHorizon
}

// window is the mask of a stream's last 2·SlowGaps-1 gaps in its history.
func (p *Pace) window() uint64 { return 1<<(2*p.gaps-1) - 1 }

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// suspectLocked keeps s among the suspects while SlowGaps-1 of its last 2·SlowGaps-2 gaps were slow (one more slow
// gap, the one under way, would make SlowGaps of its last 2·SlowGaps-1), or while its endpoint is on probation.
func (p *Pace) suspectLocked(s *stream) {
	if e := p.endpoints[s.endpoint]; (e == nil || !e.reported) && bits.OnesCount64(s.history&(p.window()>>1)) < p.gaps-1 {
		p.unsuspectLocked(s)
		return
	}
	if _, ok := p.suspects[s]; !ok {
		p.suspects[s] = struct{}{}
		if e := p.endpoints[s.endpoint]; e != nil {
			e.suspects++
		}
	}
}

// unsuspectLocked removes s from the suspects.
func (p *Pace) unsuspectLocked(s *stream) {
	if _, ok := p.suspects[s]; ok {
		delete(p.suspects, s)
		if e := p.endpoints[s.endpoint]; e != nil {
			e.suspects--
		}
	}
}

// slowGapLocked reports whether gap, of stream s of e, is slow once the prefills that may have started there since
// the chunk before s's previous one are taken out of it, at the slowest rate (see Pace).
func (p *Pace) slowGapLocked(e *endpointPace, s *stream, gap time.Duration) bool {
	explained := time.Duration(e.prefilled-s.explainFrom) * e.usual / prefillTokensPerStep
	return p.slowLocked(e, gap-explained)
}

// slowLocked reports whether gap is slow for e.
func (p *Pace) slowLocked(e *endpointPace, gap time.Duration) bool {
	return float64(gap) >= p.factor*float64(e.usual)
}

// learn adds a normal gap to the usual gap's running mean.
func (e *endpointPace) learn(gap time.Duration) {
	e.n = min(e.n+1, paceMemory)
	e.usual += (gap - e.usual) / time.Duration(e.n)
}

// reportLocked reports endpoint slow, for a slow gap or silence since from, to the detector, when most of its peers'
// pace is normal.
func (p *Pace) reportLocked(now time.Time, endpoint string, e *endpointPace, from time.Time) Ejection {
	if !p.normalPeersLocked(now, endpoint, from) {
		return Ejection{}
	}
	e.reported = true
	return p.d.ObserveSlow(now, endpoint)
}

// normalPeersLocked reports whether most of the other endpoints that streamed within healthyPeerWindow are at
// their normal pace (their latest gap normal, no stream of theirs one slow gap short of slow, not quiet over the
// silence judged, from from to now), and at least one.
func (p *Pace) normalPeersLocked(now time.Time, endpoint string, from time.Time) bool {
	active, normal := 0, 0
	for name, e := range p.endpoints {
		if name == endpoint || now.Sub(e.last) > healthyPeerWindow {
			continue
		}
		active++
		if e.suspects == 0 && !e.normalAt.IsZero() && !e.normalAt.Before(e.slowAt) && !p.silentLocked(e, now) &&
			!p.quietLocked(e, from, now) {
			normal++
		}
	}
	return normal > 0 && 2*normal > active
}

// Stalled ejects, at now, the endpoints whose streams stalled (see Pace): all of an endpoint's streams silent for
// SlowFactor times its usual gap with no prefill to explain it, or a stream one slow gap short of slow silent as
// long; it returns the ejections it started.
func (p *Pace) Stalled(now time.Time) []EndpointEjection {
	if p.factor == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var started []EndpointEjection
	report := func(name string, e *endpointPace, all bool, last, from time.Time) {
		if ej := p.reportLocked(now, name, e, from); ej.Reason != NotEjected {
			started = append(started, EndpointEjection{Endpoint: name, Ejection: ej, All: all, Silent: now.Sub(last), Usual: e.usual})
		}
	}
	for name, e := range p.endpoints {
		if p.stalledLocked(e, now) {
			report(name, e, true, e.last, e.silentSince())
		}
	}
	for s := range p.suspects {
		e := p.endpoints[s.endpoint]
		if e == nil || e.n < paceWarmup || !p.slowGapLocked(e, s, now.Sub(s.last)) {
			continue
		}
		report(s.endpoint, e, false, s.last, s.last)
	}
	return started
}

// End forgets request id's stream at now: its response ended.
func (p *Pace) End(now time.Time, id string) {
	if p.factor == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.streams[id]; s != nil {
		p.dropLocked(now, id, s)
	}
}

// dropLocked forgets stream s of request id at now.
func (p *Pace) dropLocked(now time.Time, id string, s *stream) {
	p.unsuspectLocked(s)
	delete(p.streams, id)
	e := p.endpoints[s.endpoint]
	switch {
	case e == nil:
	case s.pending:
		e.dequeue(s)
	default:
		// A slot freed: the oldest request waiting for one may start its prefill.
		e.open--
		if len(e.queue) > 0 {
			e.prefill(now, e.queue[0].tokens)
		}
	}
}

// pruneLocked drops, at most once per healthyPeerWindow, the streams idle for streamIdle and the endpoints idle for
// paceIdle, so that lost ends and pool churn cannot grow the maps.
func (p *Pace) pruneLocked(now time.Time) {
	if now.Sub(p.lastPruned) < healthyPeerWindow {
		return
	}
	p.lastPruned = now
	for id, s := range p.streams {
		if now.Sub(s.last) > streamIdle {
			p.dropLocked(now, id, s)
		}
	}
	for name, e := range p.endpoints {
		if now.Sub(e.last) > paceIdle {
			delete(p.endpoints, name)
		}
	}
}
