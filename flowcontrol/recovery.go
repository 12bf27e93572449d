package flowcontrol

import (
	"math"
	"time"
)

// bandRecovery follows, for one band, what predicting the return of its capacity needs: the overload episode the
// band is in, how long the backlog at and above it has existed, and whether that backlog is growing or shrinking.
//
// An overload episode lasts while snapshots find the band blocked (an arrival of it would not be dispatched at once):
// the first snapshot with headroom for it ends the episode. (An episode that outlasts brief headroom makes clients
// of a band that an overload near capacity still serves most of the time wait many seconds for nothing.)
type bandRecovery struct {
	overloadSince time.Time // start of the current episode; zero when none
	backlogSince  time.Time // since when the backlog at and above the band has been non-empty; zero when empty
	trend         backlogTrend
}

// The time constant of the backlog's trend is a quarter of the drain-rate window: the trend must turn within seconds
// of an overload's end, or clients turned away just after it are sent to the cap; and a backlog must have stood for a
// tenth of it (the evidence the drain rate itself needs before it counts) for its draining to end the overload.
const (
	trendWindowShare  = 4
	builtBacklogShare = 10
)

// observe records the band's state at now: whether it is blocked, and the backlog at and above it.
func (r *bandRecovery) observe(now time.Time, blocked bool, backlog float64, window time.Duration) {
	switch {
	case !blocked:
		r.overloadSince = time.Time{}
	case r.overloadSince.IsZero():
		r.overloadSince = now
	}
	r.observeBacklog(now, backlog, window)
}

// observeBacklog records the backlog at and above the band at now.
func (r *bandRecovery) observeBacklog(now time.Time, backlog float64, window time.Duration) {
	switch {
	case backlog <= 0:
		if r.built(now, window) && r.trend.slope < 0 {
			// A backlog that built up has drained: the overload that built it is over. A band still blocked now
			// (by saturation alone) starts a new episode.
			r.overloadSince = time.Time{}
		}
		r.backlogSince = time.Time{}
	case r.backlogSince.IsZero():
		r.backlogSince = now
	}
	r.trend.observe(now, backlog, (window / trendWindowShare).Seconds())
}

// capacityReturn predicts how long until band b admits again, for a band in an overload episode, given the backlog
// at and above it (including the request turned away) and the pool's drain rate (cost per second, known):
//
//   - The backlog shrinks (the overload is over): it drains at the rate it is observed to shrink, which counts the
//     arrivals that keep joining it, and never faster than the drain rate.
//   - Otherwise the overload goes on. One that has lasted d is expected to last about d more (the Lindy heuristic for
//     episodes whose length is unknown), while the backlog keeps growing at its observed rate; then the backlog built
//     up takes as long to drain as it took to build (the load after an overload is taken to be as far below
//     capacity as it was above: the drain rate alone would assume that nothing arrives once it ends), and no less
//     than the drain rate allows.
func (r *bandRecovery) capacityReturn(now time.Time, backlog, drainRate float64) time.Duration {
	episode := now.Sub(r.overloadSince).Seconds()
	built := 0.0
	if !r.backlogSince.IsZero() {
		built = now.Sub(r.backlogSince).Seconds() + episode
	}
	grown := backlog + max(0, r.trend.slope)*episode
	overload := episode + max(built, grown/drainRate)
	if slope := r.trend.slope; slope < 0 && backlog > 0 && !r.backlogSince.IsZero() {
		// Just after the trend turns, the shrink rate is near zero and the overload's estimate is the better bound.
		return secondsToDuration(min(overload, backlog/min(-slope, drainRate)))
	}
	return secondsToDuration(overload)
}

// returnBudget is the cost per second of returning clients the band can expect to admit once its capacity returns:
// while a backlog that built up shrinks, the rate it shrinks at (what the pool drains beyond the arrivals that keep
// joining it, and so what is left for the band once it has drained); otherwise the drain rate.
func (r *bandRecovery) returnBudget(now time.Time, drainRate float64, window time.Duration) float64 {
	if r.draining(now, window) {
		return min(drainRate, -r.trend.slope)
	}
	return drainRate
}

// draining reports whether the overload that built up the backlog at and above the band is over: the backlog has
// stood long enough to count as built up, and it shrinks.
func (r *bandRecovery) draining(now time.Time, window time.Duration) bool {
	return r.trend.slope < 0 && r.built(now, window)
}

// built reports whether the backlog at and above the band has stood long enough to count as built up by an
// overload, rather than one that forms and drains within moments near capacity.
func (r *bandRecovery) built(now time.Time, window time.Duration) bool {
	return !r.backlogSince.IsZero() && now.Sub(r.backlogSince) >= window/builtBacklogShare
}

// backlogTrend is the backlog's rate of change (cost per second; negative while it shrinks): an exponentially
// weighted moving average, with time constant window (seconds), of the slope between consecutive observations. The
// backlog only changes at operations and is constant in between, so observations at any instants add up to its true
// change.
type backlogTrend struct {
	slope float64
	last  time.Time
	lastB float64
}

func (t *backlogTrend) observe(now time.Time, backlog, window float64) {
	if t.last.IsZero() {
		t.last, t.lastB = now, backlog
		return
	}
	if !now.After(t.last) {
		return // the change counts at the next observation that is later
	}
	dt := now.Sub(t.last).Seconds()
	w := 1 - math.Exp(-dt/window)
	t.slope += w * ((backlog-t.lastB)/dt - t.slope)
	t.last, t.lastB = now, backlog
}
