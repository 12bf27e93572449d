package outlier

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Config is the detector's policy.
type Config struct {
	// Consecutive5xx is how many 5xx responses in a row eject an endpoint.
	Consecutive5xx int
	// LocalConsecutive5xx, when positive, is how many 5xx responses in a row eject an endpoint while another
	// endpoint is healthy (its latest response, within the last healthyPeerWindow, was a success): the failure
	// is the endpoint's own, not the pool's, so fewer of them make the case. At most Consecutive5xx; 0 turns the
	// rule off.
	LocalConsecutive5xx int
	// BaseEjectionTime is the first ejection's length; the n-th ejection in a row lasts n times as long.
	BaseEjectionTime time.Duration
	// MaxEjectionTime caps an ejection's length.
	MaxEjectionTime time.Duration
	// MaxEjectionPercent is the largest share of a pick's candidates left out, in percent (0-100).
	MaxEjectionPercent int
	// SlowFactor, when positive, is how many times its usual gap between two chunks of a stream an endpoint's gap
	// must be to count as slow (see Pace); 0 turns slow detection off. At least 1.
	SlowFactor float64
	// SlowGaps is how many of a stream's last 2·SlowGaps-1 gaps must be slow to eject its endpoint while a peer's
	// pace is normal (1-32).
	SlowGaps int
	// EjectOnStall ejects an endpoint at once when all of its streams stall with no prefill sent there to explain it
	// (see Pace); off, only SlowGaps slow gaps of one stream eject it. It needs SlowFactor.
	EjectOnStall bool
}

// Defaults: Envoy's consecutive_5xx (5) and max_ejection_percent of the pool scaled for a pool of a few model
// servers (50: one of three); two 5xx in a row while a peer is healthy (one is a blip a healthy server has; a server
// that fails two in a row while its peers succeed is failing, and waiting for five sends it three more requests to
// fail, at a failing server's fast pace); a base ejection (1 s) short enough that a server that recovers
// is used again soon, a cap (30 s) that keeps probing a dead one a few times a minute. Slow: 4 times the usual gap
// (a server twice or three times slower is in a busy batch, or a GPU class below its peers: a scorer's business, not
// an outlier), 7 such gaps of a stream's last 13 (a step that computes a long prompt stalls a batch as a slowed server
// does; testbed/virtualbench TestOutlierPaceEjectsNoHealthyServer ejected a healthy a10g fleet under bursts of long
// prompts at 5 or 6).
const (
	DefaultConsecutive5xx      = 5
	DefaultLocalConsecutive5xx = 2
	DefaultBaseEjectionTime    = time.Second
	DefaultMaxEjectionTime     = 30 * time.Second
	DefaultMaxEjectionPercent  = 50
	DefaultSlowFactor          = 4
	DefaultSlowGaps            = 7
)

// DefaultConfig returns the default policy.
func DefaultConfig() Config {
	return Config{
		Consecutive5xx:      DefaultConsecutive5xx,
		LocalConsecutive5xx: DefaultLocalConsecutive5xx,
		BaseEjectionTime:    DefaultBaseEjectionTime,
		MaxEjectionTime:     DefaultMaxEjectionTime,
		MaxEjectionPercent:  DefaultMaxEjectionPercent,
		SlowFactor:          DefaultSlowFactor,
		SlowGaps:            DefaultSlowGaps,
		EjectOnStall:        true,
	}
}

// Validate reports every invalid field.
func (c Config) Validate() error {
	var errs []error
	if c.Consecutive5xx < 1 {
		errs = append(errs, fmt.Errorf("consecutive5xx must be at least 1, got %d", c.Consecutive5xx))
	}
	if c.LocalConsecutive5xx < 0 || c.LocalConsecutive5xx > max(c.Consecutive5xx, 0) {
		errs = append(errs, fmt.Errorf("localConsecutive5xx must be within 0 (off) and consecutive5xx (%d), got %d", c.Consecutive5xx, c.LocalConsecutive5xx))
	}
	if c.BaseEjectionTime <= 0 {
		errs = append(errs, fmt.Errorf("baseEjectionTime must be positive, got %v", c.BaseEjectionTime))
	}
	if c.MaxEjectionTime < c.BaseEjectionTime {
		errs = append(errs, fmt.Errorf("maxEjectionTime (%v) must be at least baseEjectionTime (%v)", c.MaxEjectionTime, c.BaseEjectionTime))
	}
	if c.MaxEjectionPercent < 0 || c.MaxEjectionPercent > 100 {
		errs = append(errs, fmt.Errorf("maxEjectionPercent must be within 0-100, got %d", c.MaxEjectionPercent))
	}
	if c.SlowFactor != 0 && !(c.SlowFactor >= 1) {
		errs = append(errs, fmt.Errorf("slowFactor must be 0 (off) or at least 1, got %v", c.SlowFactor))
	}
	if c.SlowFactor != 0 && (c.SlowGaps < 1 || c.SlowGaps > 32) {
		errs = append(errs, fmt.Errorf("slowGaps must be within 1-32, got %d", c.SlowGaps))
	}
	return errors.Join(errs...)
}

// Detector tracks the endpoints whose recent responses failed.
type Detector struct {
	cfg Config

	mu sync.Mutex
	// endpoints holds the endpoints whose last response was a 5xx; an endpoint is absent once one succeeds.
	endpoints map[string]*record
	// slow holds the endpoints a Pace found slow, ejected now or last; an endpoint is absent once its pace is normal
	// again outside an ejection. Kept apart from endpoints: a slow server's answers succeed.
	slow map[string]*record
	// healthy holds, for each endpoint whose latest response was a success, when that was; pruned of entries older
	// than healthyPeerWindow at most once per window, so churn cannot grow it.
	healthy    map[string]time.Time
	lastPruned time.Time
}

// healthyPeerWindow is how recent a peer's successful response must be for the local rule: long enough to span the
// gaps between responses of a lightly loaded pool, short enough that a peer that has gone quiet since does not count.
const healthyPeerWindow = 10 * time.Second

type record struct {
	consecutive int       // 5xx responses in a row
	ejections   int       // ejections in a row, without a success between them
	since       time.Time // start of the current or last ejection
	until       time.Time // end of the current or last ejection; zero if never ejected
	last        time.Time // last 5xx
}

// New returns a Detector with policy cfg, which must be valid (see Config.Validate).
func New(cfg Config) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Detector{cfg: cfg, endpoints: map[string]*record{}, slow: map[string]*record{}, healthy: map[string]time.Time{}}, nil
}

// Reason says which rule ejected an endpoint. Its values are a closed set, usable as metric labels.
type Reason uint8

const (
	// NotEjected: the response ejected nothing.
	NotEjected Reason = iota
	// Consecutive5xxReason: Consecutive5xx responses in a row failed.
	Consecutive5xxReason
	// Local5xxReason: LocalConsecutive5xx responses in a row failed while a peer was healthy.
	Local5xxReason
	// RepeatReason: the first response after an ejection ended failed too.
	RepeatReason
	// SlowReason: its streams' pace was slow against its own usual pace while a peer's was normal (see Pace).
	SlowReason
)

// Reasons lists the reasons an endpoint is ejected for.
var Reasons = []Reason{Consecutive5xxReason, Local5xxReason, RepeatReason, SlowReason}

func (r Reason) String() string {
	switch r {
	case Consecutive5xxReason:
		return "consecutive_5xx"
	case Local5xxReason:
		return "local_5xx"
	case RepeatReason:
		return "repeat"
	case SlowReason:
		return "slow"
	}
	return "none"
}

// Ejection is what one observed response started: an ejection of For, for Reason; the zero Ejection when none.
type Ejection struct {
	For    time.Duration
	Reason Reason
}

// Observe records the HTTP status of a response endpoint sent at now. A 5xx counts as a failure, any other status
// clears the endpoint's record. Statuses outside 100-599 and an empty endpoint are ignored. When the response ejects
// the endpoint, Observe returns the ejection; else the zero Ejection.
func (d *Detector) Observe(now time.Time, endpoint string, status int) Ejection {
	if endpoint == "" || status < 100 || status > 599 {
		return Ejection{}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pruneHealthyLocked(now)
	if status < 500 {
		delete(d.endpoints, endpoint)
		d.healthy[endpoint] = now
		return Ejection{}
	}
	delete(d.healthy, endpoint)
	d.forgetIdleLocked(now)
	r := d.endpoints[endpoint]
	if r == nil {
		r = &record{}
		d.endpoints[endpoint] = r
	}
	r.consecutive++
	r.last = now
	if now.Before(r.until) {
		return Ejection{} // a response of a request sent before the ejection
	}
	var reason Reason
	switch {
	case r.ejections > 0:
		reason = RepeatReason
	case r.consecutive >= d.cfg.Consecutive5xx:
		reason = Consecutive5xxReason
	case d.cfg.LocalConsecutive5xx > 0 && r.consecutive >= d.cfg.LocalConsecutive5xx && d.healthyPeerLocked(now):
		reason = Local5xxReason
	default:
		return Ejection{}
	}
	return d.ejectLocked(now, r, reason)
}

// ejectLocked starts r's next ejection in a row at now.
func (d *Detector) ejectLocked(now time.Time, r *record, reason Reason) Ejection {
	r.ejections++
	length := d.ejectionTime(r.ejections)
	r.since, r.until = now, now.Add(length)
	return Ejection{For: length, Reason: reason}
}

// ObserveSlow records a Pace's verdict that endpoint is slow at now: it ejects the endpoint, for longer each time
// in a row, unless an ejection is in course (its streams started before it go on being slow meanwhile).
func (d *Detector) ObserveSlow(now time.Time, endpoint string) Ejection {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.forgetIdleLocked(now)
	r := d.slow[endpoint]
	if r == nil {
		r = &record{}
		d.slow[endpoint] = r
	}
	r.last = now
	if now.Before(r.until) {
		return Ejection{}
	}
	return d.ejectLocked(now, r, SlowReason)
}

// ObservePaced records that endpoint's pace was normal at now: outside an ejection, it clears the endpoint's slow
// record, so that a later slow-down is a first ejection again. It reports whether no slow record is left.
func (d *Detector) ObservePaced(now time.Time, endpoint string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.slow[endpoint]; r != nil && now.Before(r.until) {
		return false
	}
	delete(d.slow, endpoint)
	return true
}

// healthyPeerLocked reports whether some endpoint's latest response was a success within healthyPeerWindow of now
// (the endpoint observed last is not among them: its failure removed it).
func (d *Detector) healthyPeerLocked(now time.Time) bool {
	for _, at := range d.healthy {
		if now.Sub(at) <= healthyPeerWindow {
			return true
		}
	}
	return false
}

// pruneHealthyLocked drops, at most once per healthyPeerWindow, the successes older than it.
func (d *Detector) pruneHealthyLocked(now time.Time) {
	if now.Sub(d.lastPruned) < healthyPeerWindow {
		return
	}
	d.lastPruned = now
	for e, at := range d.healthy {
		if now.Sub(at) > healthyPeerWindow {
			delete(d.healthy, e)
		}
	}
}

// Ejected counts the endpoints ejected at now, before any pick's cap (see Eject).
func (d *Detector) Ejected(now time.Time) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for e := range d.endpoints {
		if _, ok := d.ejectedSinceLocked(now, e); ok {
			n++
		}
	}
	for e := range d.slow {
		if _, counted := d.endpoints[e]; !counted {
			if _, ok := d.ejectedSinceLocked(now, e); ok {
				n++
			}
		}
	}
	return n
}

// ejectedSinceLocked reports whether endpoint is ejected at now, for either cause, and since when (the earlier
// start when both).
func (d *Detector) ejectedSinceLocked(now time.Time, endpoint string) (time.Time, bool) {
	var since time.Time
	ejected := false
	for _, r := range []*record{d.endpoints[endpoint], d.slow[endpoint]} {
		if r != nil && now.Before(r.until) && (!ejected || r.since.Before(since)) {
			since, ejected = r.since, true
		}
	}
	return since, ejected
}

// ejectionTime is the length of the n-th ejection in a row.
func (d *Detector) ejectionTime(n int) time.Duration {
	if limit := int(d.cfg.MaxEjectionTime / d.cfg.BaseEjectionTime); n >= limit {
		return d.cfg.MaxEjectionTime
	}
	return time.Duration(n) * d.cfg.BaseEjectionTime
}

// forgetIdleLocked drops the records of endpoints that failed last so long ago that they can only have left the
// pool (a pool member is picked again at most MaxEjectionTime after an ejection), so churn cannot grow the map.
func (d *Detector) forgetIdleLocked(now time.Time) {
	horizon := now.Add(-2 * d.cfg.MaxEjectionTime)
	for _, records := range []map[string]*record{d.endpoints, d.slow} {
		for e, r := range records {
			if r.last.Before(horizon) && !now.Before(r.until) {
				delete(records, e)
			}
		}
	}
}

// Clean reports whether no endpoint's last response was a 5xx and none was found slow since its pace was last
// normal, so that no candidate can be ejected: a pick can skip Eject.
func (d *Detector) Clean() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.endpoints) == 0 && len(d.slow) == 0
}

// Eject marks in out (len(out) == len(candidates)) the candidates to leave out of a pick at now: those ejected, at
// most MaxEjectionPercent of the candidates (at least one of two or more), the longest-ejected first, never all. It
// returns how many it marked.
func (d *Detector) Eject(now time.Time, candidates []string, out []bool) int {
	clear(out)
	limit := len(candidates) * d.cfg.MaxEjectionPercent / 100
	if limit == 0 && d.cfg.MaxEjectionPercent > 0 {
		limit = 1
	}
	limit = min(limit, len(candidates)-1)
	if limit <= 0 {
		return 0
	}
	type ejected struct {
		i     int
		since time.Time
	}
	var found []ejected
	d.mu.Lock()
	for i, c := range candidates {
		if since, ok := d.ejectedSinceLocked(now, c); ok {
			found = append(found, ejected{i, since})
		}
	}
	d.mu.Unlock()
	if len(found) > limit {
		slices.SortStableFunc(found, func(a, b ejected) int { return a.since.Compare(b.since) })
		found = found[:limit]
	}
	for _, f := range found {
		out[f.i] = true
	}
	return len(found)
}
