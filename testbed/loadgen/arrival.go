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
)

// ArrivalConfig configures an open-loop arrival process.
type ArrivalConfig struct {
	Kind ArrivalKind `json:"kind"`
	// Rate is requests per second (during ON windows for bursty).
	Rate     float64       `json:"rate"`
	BurstOn  time.Duration `json:"burst_on_ns,omitempty"`
	BurstOff time.Duration `json:"burst_off_ns,omitempty"`
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
	default:
		errs = append(errs, fmt.Errorf("arrival kind %q is not poisson, constant or bursty", c.Kind))
	}
	if math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) || c.Rate <= 0 {
		errs = append(errs, fmt.Errorf("rate must be a positive number of requests per second, got %v", c.Rate))
	}
	return errors.Join(errs...)
}

// MeanRate is the long-run arrival rate in requests per second.
func (c ArrivalConfig) MeanRate() float64 {
	if c.Kind == ArrivalBursty {
		return c.Rate * float64(c.BurstOn) / float64(c.BurstOn+c.BurstOff)
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

func secondsToDuration(s float64) time.Duration {
	if s >= float64(math.MaxInt64)/float64(time.Second) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * float64(time.Second))
}
