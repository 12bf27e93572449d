package loadgen

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// ArrivalKind selects the open-loop arrival process.
type ArrivalKind string

const (
	// ArrivalPoisson: exponential inter-arrival times at Rate.
	ArrivalPoisson ArrivalKind = "poisson"
	// ArrivalConstant: exactly 1/Rate apart.
	ArrivalConstant ArrivalKind = "constant"
	// ArrivalBursty: on/off. A Poisson process at Rate during ON windows of
	// BurstOn, silence for BurstOff, repeating from ON at time 0. The mean
	// rate is Rate*BurstOn/(BurstOn+BurstOff).
	ArrivalBursty ArrivalKind = "bursty"
	// ArrivalPhased: a Poisson process whose rate changes in Phases, one
	// after another from time 0; after the last phase its rate goes on. A
	// phase may be silent (rate 0), e.g. an overload followed by a lull.
	ArrivalPhased ArrivalKind = "phased"
)

// Phase is one stretch of a phased arrival process.
type Phase struct {
	// Rate is requests per second during the phase (0: silence).
	Rate     float64       `json:"rate"`
	Duration time.Duration `json:"duration_ns"`
}

// ArrivalConfig configures an open-loop arrival process.
type ArrivalConfig struct {
	Kind ArrivalKind `json:"kind"`
	// Rate is requests per second (during ON windows for bursty).
	Rate     float64       `json:"rate"`
	BurstOn  time.Duration `json:"burst_on_ns,omitempty"`
	BurstOff time.Duration `json:"burst_off_ns,omitempty"`
	// Phases drive phased arrivals (Rate is then unused and must be 0).
	Phases []Phase `json:"phases,omitempty"`
}

// Validate reports a config that cannot produce arrivals.
func (c ArrivalConfig) Validate() error {
	var errs []error
	switch c.Kind {
	case ArrivalPoisson, ArrivalConstant:
	case ArrivalBursty:
		if c.BurstOn <= 0 || c.BurstOff < 0 {
			errs = append(errs, errors.New("bursty arrivals need a positive burst-on and a non-negative burst-off window"))
		}
	case ArrivalPhased:
		return c.validatePhases()
	default:
		errs = append(errs, fmt.Errorf("arrival kind %q is not poisson, constant, bursty or phased", c.Kind))
	}
	if len(c.Phases) > 0 {
		errs = append(errs, fmt.Errorf("phases apply to phased arrivals only, not %q", c.Kind))
	}
	if !positiveRate(c.Rate) {
		errs = append(errs, fmt.Errorf("rate must be a positive number of requests per second, got %v", c.Rate))
	}
	return errors.Join(errs...)
}

func positiveRate(r float64) bool { return !math.IsNaN(r) && !math.IsInf(r, 0) && r > 0 }

func (c ArrivalConfig) validatePhases() error {
	var errs []error
	if c.Rate != 0 || c.BurstOn != 0 || c.BurstOff != 0 {
		errs = append(errs, errors.New("phased arrivals take their rates from phases: drop rate, burst-on and burst-off"))
	}
	if len(c.Phases) == 0 {
		errs = append(errs, errors.New("phased arrivals need at least one phase"))
	}
	for i, p := range c.Phases {
		if p.Duration <= 0 {
			errs = append(errs, fmt.Errorf("phase %d: duration must be positive, got %v", i+1, p.Duration))
		}
		if p.Rate != 0 && !positiveRate(p.Rate) {
			errs = append(errs, fmt.Errorf("phase %d: rate must be a non-negative number of requests per second, got %v", i+1, p.Rate))
		}
	}
	if n := len(c.Phases); n > 0 && !positiveRate(c.Phases[n-1].Rate) {
		errs = append(errs, errors.New("the last phase's rate goes on after it and must be positive"))
	}
	return errors.Join(errs...)
}

// RateAt is the arrival rate in force at offset t from the start (the
// mean rate for bursty arrivals in an ON window, 0 in an OFF window).
func (c ArrivalConfig) RateAt(t time.Duration) float64 {
	switch c.Kind {
	case ArrivalBursty:
		if t%(c.BurstOn+c.BurstOff) < c.BurstOn {
			return c.Rate
		}
		return 0
	case ArrivalPhased:
		for _, p := range c.Phases {
			if t < p.Duration {
				return p.Rate
			}
			t -= p.Duration
		}
		return c.Phases[len(c.Phases)-1].Rate
	}
	return c.Rate
}

// MeanRate is the long-run arrival rate in requests per second.
// For phased arrivals it is the mean over the phases.
func (c ArrivalConfig) MeanRate() float64 {
	switch c.Kind {
	case ArrivalBursty:
		return c.Rate * float64(c.BurstOn) / float64(c.BurstOn+c.BurstOff)
	case ArrivalPhased:
		var n, d float64
		for _, p := range c.Phases {
			n += p.Rate * p.Duration.Seconds()
			d += p.Duration.Seconds()
		}
		return n / d
	}
	return c.Rate
}

// Arrivals generates arrival offsets from the start of a run. It is pure:
// the sequence depends only on the config and the seed. Not safe for
// concurrent use.
type Arrivals struct {
	cfg ArrivalConfig
	rng *rand.Rand
	// active is the arrival time on the "active clock", which runs only
	// during ON windows (all the time for non-bursty kinds), in seconds.
	active float64
	n      int
}

// NewArrivals returns the arrival process of a valid config.
func NewArrivals(cfg ArrivalConfig, seed uint64) (*Arrivals, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Arrivals{cfg: cfg, rng: rand.New(rand.NewPCG(seed, 0xa1a1))}, nil
}

// Next returns the offset of the next arrival; offsets never decrease. The
// first Poisson arrival is an exponential gap after 0; the first constant
// arrival is at 0.
func (a *Arrivals) Next() time.Duration {
	switch a.cfg.Kind {
	case ArrivalConstant:
		a.active = float64(a.n) / a.cfg.Rate
	case ArrivalPhased:
		a.n++
		a.active = a.nextPhased(a.rng.ExpFloat64())
		return secondsToDuration(a.active)
	default:
		a.active += a.rng.ExpFloat64() / a.cfg.Rate
	}
	a.n++
	if a.cfg.Kind != ArrivalBursty {
		return secondsToDuration(a.active)
	}
	// Map active time to wall time: every full ON window adds an OFF window.
	on, off := a.cfg.BurstOn.Seconds(), a.cfg.BurstOff.Seconds()
	windows := math.Floor(a.active / on)
	return secondsToDuration(windows*(on+off) + (a.active - windows*on))
}

// nextPhased moves from the last arrival (a.active, in seconds) through the
// phases until the rates met on the way add up to an intensity of e: the
// next arrival of a Poisson process whose rate changes from phase to phase.
func (a *Arrivals) nextPhased(e float64) float64 {
	t, start := a.active, 0.0
	for i, p := range a.cfg.Phases {
		end := start + p.Duration.Seconds()
		if i == len(a.cfg.Phases)-1 {
			end = math.Inf(1)
		}
		if t < end {
			if p.Rate > 0 && e <= p.Rate*(end-t) {
				return t + e/p.Rate
			}
			if p.Rate > 0 {
				e -= p.Rate * (end - t)
			}
			t = end
		}
		start = end
	}
	return t // unreachable: the last phase's rate is positive and has no end
}

func secondsToDuration(s float64) time.Duration {
	if s >= float64(math.MaxInt64)/float64(time.Second) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * float64(time.Second))
}
