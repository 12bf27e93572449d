package flowcontrol

import (
	"math"
	"time"
)

// Seats: every endpoint runs at most its concurrency (endpointState.limit) of requests at once, and admission sends
// it no more, so requests wait in the EPP, in its priority and fair order, and a request the EPP sends starts at
// once. A request that must start at once on arrival, though, finds a free seat only if one was kept idle for it:
// under overload lower bands would fill every seat the moment it frees. So, as Kubernetes API Priority and Fairness
// keeps seats for a priority level sized from its observed demand, while Critical traffic is active lower bands leave
// a number of seats idle: a Critical arrival takes one, and the next seat that frees, whatever it ran, refills the
// reserve before a lower band may take a seat again.
//
// How many: the idle seats form a birth-death chain, taken at the Critical arrival rate and given back at the rate
// seats free (every release), up to the reserve. A Critical arrival finds none idle with probability
// 1 / (1 + r + r^2 + ... + r^reserve), r being the rate seats free over the Critical arrival rate; the reserve is the
// smallest that keeps this at most seatMiss. Few Critical requests against many seats freeing need one or two; many
// Critical requests on a small fleet need more. Both rates are measured (rateMeter), so the reserve follows the
// demand actually seen.

// seatMiss is the share of Critical arrivals the reserve is sized to let find no idle seat (they wait for the next
// seat to free, first in line): one in a hundred, so that Critical's 99th percentile starts at once.
const seatMiss = 0.01

// reserveSeats returns how many seats must stay idle for arrivals at rate arrivals when seats free at rate frees
// (both per second), at most maxSeats (and at least 1).
func reserveSeats(arrivals, frees float64, maxSeats int) int {
	maxSeats = max(1, maxSeats)
	if !(arrivals > 0) {
		return 1
	}
	r := frees / arrivals
	term, sum := 1.0, 1.0
	for n := 1; n <= maxSeats; n++ {
		term *= r
		sum += term
		if 1/sum <= seatMiss {
			return n
		}
	}
	return maxSeats
}

// seatBoundLocked reports whether e is seat-bound: its occupancy reached its seats within the drain-rate window (the
// span the Critical reserve looks back over). There seats are what a request waits for. Elsewhere (an endpoint far
// from its concurrency, where prompts contend in prefill first) the bands' saturation ceilings keep Critical's
// headroom, as they did before seats.
func (c *Controller) seatBoundLocked(e *endpointState, now time.Time) bool {
	return e.seats > 0 && e.fullNs != 0 && now.UnixNano()-e.fullNs < int64(c.cfg.DrainRateWindow)
}

// seatReserveLocked returns the number of seats lower bands must leave idle on the fresh seat-bound endpoints while
// the Critical reserve is on (0 when none is seat-bound), and how many of their seats are idle now. The reserve is at
// most half of those endpoints' seats; with live peers it is this replica's part of the pool's (pooledReserveLocked).
func (c *Controller) seatReserveLocked(now time.Time) (reserve, idle int) {
	seats, idle, frees := c.seatFiguresLocked(now)
	return c.criticalSeatsLocked(seats, frees, now), idle
}

// criticalSeatsLocked is seatReserveLocked's reserve, from the seat figures (seatFiguresLocked) of the fresh seat-bound
// endpoints.
func (c *Controller) criticalSeatsLocked(seats int, frees float64, now time.Time) int {
	if seats == 0 {
		return 0
	}
	arrivals, _ := c.criticalArrivals.rate(now)
	if c.peers.ReserveShare != nil {
		return c.pooledReserveLocked(arrivals, frees, seats)
	}
	return reserveSeats(arrivals, frees, seats/2)
}

// seatFiguresLocked returns the seats of the fresh seat-bound endpoints, how many of them are idle, and the rate they
// free (per second; 0 while no hold time is learned).
func (c *Controller) seatFiguresLocked(now time.Time) (seats, idle int, frees float64) {
	seats, idle, frees, _ = c.seatFiguresWithinLocked(now, c.cfg.Endpoint.MetricsStaleness)
	return seats, idle, frees
}

// seatFiguresWithinLocked is seatFiguresLocked over the endpoints scraped within staleness of now; whole reports
// whether every one of those endpoints is seat-bound (true with none): the rate their seats free is then all they
// drain.
func (c *Controller) seatFiguresWithinLocked(now time.Time, staleness time.Duration) (seats, idle int, frees float64, whole bool) {
	cutoff := freshCutoff(now, staleness)
	whole = true
	for i := range c.endpoints {
		e := &c.endpoints[i]
		if !e.usable(cutoff) {
			continue
		}
		if !c.seatBoundLocked(e, now) {
			whole = false
			continue
		}
		seats += c.seatsLocked(e)
		idle += c.freeSeatsLocked(e)
	}
	// Seats free at the rate a full pool frees them (Little's law): the reserve matters when lower bands keep every
	// other seat busy, and sizing it from the seats busy now would grow it as the pool empties, and empty it further.
	if seats > 0 && c.holdTime > 0 {
		frees = float64(seats) / c.holdTime.Seconds()
	}
	return seats, idle, frees, whole
}

// holdTimeWeight is the weight of each release in the smoothed time a request holds a seat: about the last twenty
// requests count.
const holdTimeWeight = 0.05

// learnHoldTimeLocked folds the time a released request held its seat into the pool's smoothed hold time, which with
// the busy seats gives the rate seats free (Little's law).
func (c *Controller) learnHoldTimeLocked(held time.Duration) {
	c.holdTime = smoothDuration(c.holdTime, held, holdTimeWeight)
}

// rateMeter measures how often something happens: an exponentially weighted moving average, with time constant
// window, of events per second. Until a window has passed it averages over the time since the first event, so a rate
// is right from the start rather than growing from zero.
type rateMeter struct {
	window float64 // seconds
	// events and span are exponentially decayed sums: events counted, and seconds elapsed.
	events, span float64
	last         time.Time
}

func newRateMeter(window time.Duration) rateMeter { return rateMeter{window: window.Seconds()} }

// advance decays the sums to now.
func (m *rateMeter) advance(now time.Time) {
	if m.last.IsZero() {
		m.last = now
		return
	}
	if !now.After(m.last) {
		return
	}
	dt := now.Sub(m.last).Seconds()
	m.last = now
	decay := math.Exp(-dt / m.window)
	m.events *= decay
	m.span = m.span*decay + m.window*(1-decay)
}

// add counts n events at now.
func (m *rateMeter) add(now time.Time, n float64) {
	m.advance(now)
	m.events += n
}

// rate is the events per second at now, and false before any time has passed since the first event.
func (m *rateMeter) rate(now time.Time) (float64, bool) {
	m.advance(now)
	if m.span <= 0 {
		return 0, false
	}
	return m.events / m.span, true
}

// setWindow changes the time constant, keeping the measured rate.
func (m *rateMeter) setWindow(window time.Duration) {
	w := window.Seconds()
	if w == m.window || m.window == 0 {
		m.window = w
		return
	}
	r := w / m.window
	m.events *= r
	m.span *= r
	m.window = w
}
