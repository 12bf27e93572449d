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
	// BaseEjectionTime is the first ejection's length; the n-th ejection in a row lasts n times as long.
	BaseEjectionTime time.Duration
	// MaxEjectionTime caps an ejection's length.
	MaxEjectionTime time.Duration
	// MaxEjectionPercent is the largest share of a pick's candidates left out, in percent (0-100).
	MaxEjectionPercent int
}

// Defaults: Envoy's consecutive_5xx (5) and max_ejection_percent of the pool scaled for a pool of a few model
// servers (50: one of three); a base ejection (1 s) short enough that a server that recovers is used again soon, a cap
// (30 s) that keeps probing a dead one a few times a minute.
const (
	DefaultConsecutive5xx     = 5
	DefaultBaseEjectionTime   = time.Second
	DefaultMaxEjectionTime    = 30 * time.Second
	DefaultMaxEjectionPercent = 50
)

// DefaultConfig returns the default policy.
func DefaultConfig() Config {
	return Config{
		Consecutive5xx:     DefaultConsecutive5xx,
		BaseEjectionTime:   DefaultBaseEjectionTime,
		MaxEjectionTime:    DefaultMaxEjectionTime,
		MaxEjectionPercent: DefaultMaxEjectionPercent,
	}
}

// Validate reports every invalid field.
func (c Config) Validate() error {
	var errs []error
	if c.Consecutive5xx < 1 {
		errs = append(errs, fmt.Errorf("consecutive5xx must be at least 1, got %d", c.Consecutive5xx))
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
	return errors.Join(errs...)
}

// Detector tracks the endpoints whose recent responses failed.
type Detector struct {
	cfg Config

	mu sync.Mutex
	// endpoints holds the endpoints whose last response was a 5xx; an endpoint is absent once one succeeds.
	endpoints map[string]*record
}

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
	return &Detector{cfg: cfg, endpoints: map[string]*record{}}, nil
}

// Observe records the HTTP status of a response endpoint sent at now. A 5xx counts as a failure, any other status
// clears the endpoint's record. Statuses outside 100-599 and an empty endpoint are ignored. When the response ejects
// the endpoint, Observe returns the ejection's length; else 0.
func (d *Detector) Observe(now time.Time, endpoint string, status int) time.Duration {
	if endpoint == "" || status < 100 || status > 599 {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if status < 500 {
		delete(d.endpoints, endpoint)
		return 0
	}
	d.forgetIdleLocked(now)
	r := d.endpoints[endpoint]
	if r == nil {
		r = &record{}
		d.endpoints[endpoint] = r
	}
	r.consecutive++
	r.last = now
	if r.consecutive < d.cfg.Consecutive5xx || now.Before(r.until) {
		return 0 // below the threshold, or a response of a request sent before the ejection
	}
	r.ejections++
	length := d.ejectionTime(r.ejections)
	r.since, r.until = now, now.Add(length)
	return length
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
	for e, r := range d.endpoints {
		if r.last.Before(horizon) && !now.Before(r.until) {
			delete(d.endpoints, e)
		}
	}
}

// Clean reports whether no endpoint's last response was a 5xx, so that no candidate can be ejected: a pick can skip
// Eject.
func (d *Detector) Clean() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.endpoints) == 0
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
		if r := d.endpoints[c]; r != nil && now.Before(r.until) {
			found = append(found, ejected{i, r.since})
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
