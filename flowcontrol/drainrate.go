package flowcontrol

import (
	"math"
	"time"
)

// drainEstimator measures how fast the pool absorbs work while requests wait in the EPP: an exponentially weighted
// moving average of dispatched cost per second of backlogged time. Only backlogged time counts, because while nothing
// waits the dispatch rate is the arrival rate, not the pool's capacity; an idle spell therefore leaves the last
// measured drain rate intact instead of decaying it to zero (which would make every burst look hopeless).
//
// It is a rateMeter of dispatched cost whose clock runs only while backlogged. All methods take the time
// explicitly; the Controller calls advance at the start of every operation.
type drainEstimator struct {
	meter      rateMeter // dispatched cost per second of backlogged time
	backlogged bool
}

func newDrainEstimator(window time.Duration) drainEstimator {
	return drainEstimator{meter: newRateMeter(window)}
}

// advance accounts the time since the previous call, in the backlog state set by setBacklogged: time spent with
// nothing waiting passes without decaying what was measured.
func (d *drainEstimator) advance(now time.Time) {
	if !d.backlogged && !d.meter.last.IsZero() && now.After(d.meter.last) {
		d.meter.last = now
		return
	}
	d.meter.advance(now)
}

// setWindow changes the time constant, keeping the measured rate and the fraction of a window of evidence gathered.
func (d *drainEstimator) setWindow(window time.Duration) { d.meter.setWindow(window) }

// setBacklogged records whether requests are waiting from now on.
func (d *drainEstimator) setBacklogged(b bool) { d.backlogged = b }

// add records cost dispatched while backlogged.
func (d *drainEstimator) add(cost float64) { d.meter.events += cost }

// rate returns the drain rate in cost units per second, and false until a tenth of a window of backlogged time has
// been observed (too little evidence to predict waits from).
func (d *drainEstimator) rate() (float64, bool) {
	m := &d.meter
	if m.span < m.window/10 || m.events <= 0 {
		return 0, false
	}
	return m.events / m.span, true
}

// settled reports whether a whole window of backlogged time has been observed: before that the rate still leans on
// the first moments of an overload, when the pool may not have drained at all (a warm-up whose requests all started
// together and none has ended yet).
func (d *drainEstimator) settled() bool {
	return d.meter.span >= d.meter.window*(1-1/math.E)
}

// retryAfter turns an estimated time-until-admission into an RFC 9110 delay-seconds value: clamp the estimate to
// [lo, hi] and round it up to whole seconds s, then spread it over s to s+jitter*s whole seconds (u is uniform in
// [0, 1)) and clamp again. The spread only lengthens the wait: a client sent back before the estimate returns while
// capacity is still expected to be short. It is applied after the first clamp so that clients shed at the lower bound
// do not all return at the same second (those at the upper bound stay there).
func retryAfter(estimate, lo, hi time.Duration, jitter, u float64) time.Duration {
	s := math.Ceil(clampF(estimate.Seconds(), lo.Seconds(), hi.Seconds()))
	s += math.Floor(u * (jitter*s + 1))
	// At least 1: a bound under a second must not turn a 429 into Retry-After: 0.
	return time.Duration(max(1, clampF(s, lo.Seconds(), math.Floor(hi.Seconds())))) * time.Second
}

func clampF(v, lo, hi float64) float64 {
	if math.IsNaN(v) || v < lo {
		return lo
	}
	if v > hi {
		return hi
	}
	return v
}

// secondsToDuration converts seconds to a Duration, saturating instead of overflowing.
func secondsToDuration(s float64) time.Duration {
	if s >= float64(math.MaxInt64)/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}
