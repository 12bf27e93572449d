package outlier

import (
	"math/bits"
	"sync"
	"time"
)

// Pace finds the endpoints that became slow, from the pace of their streamed responses, and ejects them through
// its Detector (ObserveSlow). A gap is the time between two chunks of one stream; a slow gap is at least SlowFactor
// times the endpoint's usual gap. An endpoint is slow when SlowGaps of the last 2·SlowGaps-1 gaps of one of its
// streams were slow (the median of its recent gaps is), while most of the other endpoints streaming are at their
// normal pace.
//
// Why the gap between chunks: a model server streams a chunk per token, one per engine step, so the gap is the
// server's step time. It does not grow with the server's queue, as the time to the first chunk does, nor with the
// request's own prompt, computed before its first chunk. Why the endpoint's own usual gap rather than its peers':
// a pool of mixed GPUs holds servers 3x apart in step time by design; a server several times slower than itself
// is not normal. Why several gaps, and the median of a stream's recent gaps rather than a run of slow ones: a step
// that computes another request's long prompt delays every stream of the batch once, while a slowed server delays
// every step; and a chunk delayed on its way (a busy proxy, a busy EPP) makes one gap long and the next one short,
// which must not reset the count. Why most peers at their normal pace: when the whole pool slows down together (a
// burst of long prompts, more load), none of them is the outlier.
//
// The usual gap is the mean of the endpoint's normal gaps (below SlowFactor times it, on streams with no slow gap
// in their window) over about the last paceMemory of them, judged from paceWarmup on. Slow gaps do not move it, so a
// slow-down does not become the server's normal while it lasts. A stall counts before the chunk that ends it: at a
// pick (Stalled), a stream one slow gap short that has sent nothing for SlowFactor times the usual gap counts the
// gap under way as slow, so a server that slowed down is left out before its slow chunks arrive. Once reported, an
// endpoint is on probation until a stream of it has a whole window of normal gaps: meanwhile one slow gap or stall
// reports it again (the Detector ejects it again if its ejection is over), as one 5xx after a 5xx ejection does.
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
)

type stream struct {
	endpoint string
	last     time.Time // latest chunk
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
			p.unsuspectLocked(s)
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
	slow := p.slowLocked(e, gap)
	clean := s.history == 0
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
	if !e.reported && bits.OnesCount64(s.history) < p.gaps {
		return Ejection{}
	}
	return p.reportLocked(now, endpoint, e)
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

// slowLocked reports whether gap is slow for e.
func (p *Pace) slowLocked(e *endpointPace, gap time.Duration) bool {
	return float64(gap) >= p.factor*float64(e.usual)
}

// learn adds a normal gap to the usual gap's running mean.
func (e *endpointPace) learn(gap time.Duration) {
	e.n = min(e.n+1, paceMemory)
	e.usual += (gap - e.usual) / time.Duration(e.n)
}

// reportLocked reports endpoint slow to the detector, when most of its peers' pace is normal.
func (p *Pace) reportLocked(now time.Time, endpoint string, e *endpointPace) Ejection {
	if !p.normalPeersLocked(now, endpoint) {
		return Ejection{}
	}
	e.reported = true
	return p.d.ObserveSlow(now, endpoint)
}

// normalPeersLocked reports whether most of the other endpoints that streamed within healthyPeerWindow are at
// their normal pace (their latest gap normal, no stream of theirs one slow gap short of slow), and at least one.
func (p *Pace) normalPeersLocked(now time.Time, endpoint string) bool {
	active, normal := 0, 0
	for name, e := range p.endpoints {
		if name == endpoint || now.Sub(e.last) > healthyPeerWindow {
			continue
		}
		active++
		if e.suspects == 0 && !e.normalAt.IsZero() && !e.normalAt.Before(e.slowAt) {
			normal++
		}
	}
	return normal > 0 && 2*normal > active
}

// Stalled ejects, at now, the endpoints of the streams one slow gap short of slow that have sent nothing for
// SlowFactor times their endpoint's usual gap (see Pace), and returns the ejections it started.
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
		p.unsuspectLocked(s)
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
			p.unsuspectLocked(s)
			delete(p.streams, id)
		}
	}
	for name, e := range p.endpoints {
		if now.Sub(e.last) > paceIdle {
			delete(p.endpoints, name)
		}
	}
}
