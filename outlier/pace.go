package outlier

import (
	"sync"
	"time"
)

// Pace finds the endpoints that became slow, from the pace of their streamed responses, and ejects them through
// its Detector (ObserveSlow). A gap is the time between two chunks of one stream. An endpoint is slow when one of its
// streams has SlowGaps gaps in a row each at least SlowFactor times the endpoint's usual gap, while another endpoint's
// latest gap was normal for that endpoint.
//
// Why the gap between chunks: a model server streams a chunk per token, one per engine step, so the gap is the
// server's step time. It does not grow with the server's queue, as the time to the first chunk does, nor with the
// request's own prompt, computed before its first chunk. Why the endpoint's own usual gap rather than its peers':
// a pool of mixed GPUs holds servers 3x apart in step time by design; a server several times slower than itself
// is not normal. Why several gaps in a row: a step that computes another request's long prompt delays every
// stream of the batch once; a slowed server delays every step. Why a peer at its normal pace: when every endpoint
// slows down together (the whole pool got more load or longer prompts), none of them is the outlier.
//
// The usual gap is the mean of the endpoint's normal gaps (those below SlowFactor times it) over about the last
// paceMemory of them, judged from paceWarmup on. Slow gaps do not move it, so a slow-down does not become the
// server's normal while it lasts. A stall counts before the chunk that ends it: at a pick (Stalled), a stream whose
// last SlowGaps-1 gaps were slow and which has sent nothing for SlowFactor times the usual gap counts the gap
// under way as slow, so a server that slowed down is left out before its slow chunks arrive.
//
// Non-streamed responses give no gaps: one chunk, at the end. A Pace is safe for concurrent use; one mutex guards
// it, taken before the Detector's.
type Pace struct {
	d      *Detector
	factor float64
	gaps   int

	mu sync.Mutex
	// streams holds the streams under way by request ID, from their first chunk to End (or to streamIdle
	// without a chunk).
	streams map[string]*stream
	// suspects are the streams whose last gaps in a row were slow, one short of SlowGaps: the streams a stall
	// makes slow.
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
)

type stream struct {
	endpoint string
	last     time.Time // latest chunk
	slow     int       // slow gaps in a row
}

type endpointPace struct {
	usual    time.Duration // mean of the normal gaps
	n        int           // gaps learnt, up to paceMemory
	last     time.Time     // latest chunk
	normalAt time.Time     // latest normal gap
	slowAt   time.Time     // latest slow gap
	reported bool          // reported slow to the detector, not yet cleared by a normal gap
}

// EndpointEjection is an ejection of Endpoint.
type EndpointEjection struct {
	Endpoint string
	Ejection
}

// NewPace returns a Pace that ejects slow endpoints through d, by d's SlowFactor and SlowGaps; with SlowFactor 0
// it judges nothing.
func NewPace(d *Detector) *Pace {
	return &Pace{
		d: d, factor: d.cfg.SlowFactor, gaps: d.cfg.SlowGaps,
		streams: map[string]*stream{}, suspects: map[*stream]struct{}{}, endpoints: map[string]*endpointPace{},
	}
}

// Chunk records a chunk of request id's streamed response, sent by endpoint, at now. When the gap since the
// stream's previous chunk ejects the endpoint, Chunk returns the ejection; else the zero Ejection. An empty id or
// endpoint is ignored.
func (p *Pace) Chunk(now time.Time, id, endpoint string) Ejection {
	if p.factor == 0 || id == "" || endpoint == "" {
		return Ejection{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pruneLocked(now)
	e := p.endpoints[endpoint]
	if e == nil {
		e = &endpointPace{}
		p.endpoints[endpoint] = e
	}
	e.last = now
	s := p.streams[id]
	if s == nil || s.endpoint != endpoint {
		if s != nil {
			delete(p.suspects, s)
		}
		s = &stream{endpoint: endpoint, last: now}
		p.streams[id] = s
		p.suspectLocked(s)
		return Ejection{}
	}
	gap := now.Sub(s.last)
	s.last = now
	if e.n < paceWarmup {
		e.learn(gap)
		return Ejection{}
	}
	if !p.slowLocked(e, gap) {
		s.slow = 0
		p.suspectLocked(s)
		e.learn(gap)
		e.normalAt = now
		if e.reported && p.d.ObservePaced(now, endpoint) {
			e.reported = false
		}
		return Ejection{}
	}
	e.slowAt = now
	s.slow++
	p.suspectLocked(s)
	if s.slow < p.gaps {
		return Ejection{}
	}
	return p.reportLocked(now, endpoint, e)
}

// suspectLocked keeps s among the suspects while its slow gaps in a row are at least SlowGaps-1.
func (p *Pace) suspectLocked(s *stream) {
	if s.slow >= p.gaps-1 {
		p.suspects[s] = struct{}{}
	} else {
		delete(p.suspects, s)
	}
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

// reportLocked reports endpoint slow to the detector, when a peer's pace is normal.
func (p *Pace) reportLocked(now time.Time, endpoint string, e *endpointPace) Ejection {
	if !p.normalPeerLocked(now, endpoint) {
		return Ejection{}
	}
	e.reported = true
	return p.d.ObserveSlow(now, endpoint)
}

// normalPeerLocked reports whether an endpoint other than endpoint had a normal latest gap within healthyPeerWindow.
func (p *Pace) normalPeerLocked(now time.Time, endpoint string) bool {
	for name, e := range p.endpoints {
		if name != endpoint && !e.normalAt.IsZero() && !e.normalAt.Before(e.slowAt) && now.Sub(e.normalAt) <= healthyPeerWindow {
			return true
		}
	}
	return false
}

// Stalled ejects, at now, the endpoints of the streams whose last SlowGaps-1 gaps were slow and that have sent
// nothing for SlowFactor times their endpoint's usual gap (see Pace), and returns the ejections it started.
func (p *Pace) Stalled(now time.Time) []EndpointEjection {
	if p.factor == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var started []EndpointEjection
	for s := range p.suspects {
		e := p.endpoints[s.endpoint]
		if e == nil || e.n < paceWarmup || !p.slowLocked(e, now.Sub(s.last)) {
			continue
		}
		if ej := p.reportLocked(now, s.endpoint, e); ej.Reason != NotEjected {
			started = append(started, EndpointEjection{Endpoint: s.endpoint, Ejection: ej})
		}
	}
	return started
}

// End forgets request id's stream: its response ended.
func (p *Pace) End(id string) {
	if p.factor == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.streams[id]; s != nil {
		delete(p.suspects, s)
		delete(p.streams, id)
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
			delete(p.suspects, s)
			delete(p.streams, id)
		}
	}
	for name, e := range p.endpoints {
		if now.Sub(e.last) > paceIdle {
			delete(p.endpoints, name)
		}
	}
}
