package virtualbench

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// NamedRouter is a contender with the name it is reported under.
type NamedRouter struct {
	Name   string
	Router Router
}

// ScaleConfig is a scale study: the same load per server on growing fleets, every contender on every fleet.
type ScaleConfig struct {
	// Base is the run configuration: mix, seed, duration, objectives, retry policy... Its fleet, arrival rate and
	// router are set per point.
	Base Config
	// Sizes are the fleet sizes, e.g. 8, 64, 256, 1000.
	Sizes []int
	// Fleet returns the fleet spec of n servers. Default MixedFleet.
	Fleet func(n int) string
	// RatePerServer is the Poisson arrival rate per server; a fleet of n servers gets n times it.
	RatePerServer float64
	// Routers are the contenders; the first is the baseline of the quality ratios (normally round-robin).
	Routers []NamedRouter
}

// MixedFleet is half H100s and half A10Gs (the odd server an H100).
func MixedFleet(n int) string {
	if n < 2 {
		return fmt.Sprintf("h100:%d", n)
	}
	return fmt.Sprintf("h100:%d,a10g:%d", n-n/2, n/2)
}

// ScalePoint is one fleet size.
type ScalePoint struct {
	Servers int
	// Rate is the offered load in requests per second.
	Rate    float64
	Results []ScaleResult // in ScaleConfig.Routers order
}

// ScaleResult is one contender on one fleet.
type ScaleResult struct {
	Router              string
	Requests, Succeeded int
	TTFTP50, TTFTP99    time.Duration
	// TTFTP99VsBaseline is TTFTP99 over the baseline contender's: the routing quality.
	TTFTP99VsBaseline float64
	// EPPPerRequest and EPPCPUPerRequest are the endpoint picker's wall and CPU time per routed request: its cost.
	EPPPerRequest, EPPCPUPerRequest time.Duration
	// PrefixHitRate is the fleet's prefix-cache hit rate.
	PrefixHitRate float64
	// Virtual and Wall are the run's virtual and wall time.
	Virtual, Wall time.Duration
}

// Scale runs the study. Points run one after another; each contender's run is independent and deterministic.
func Scale(cfg ScaleConfig) ([]ScalePoint, error) {
	if len(cfg.Routers) == 0 || len(cfg.Sizes) == 0 || !(cfg.RatePerServer > 0) {
		return nil, errors.New("a scale study needs routers, sizes and a positive rate per server")
	}
	fleet := cfg.Fleet
	if fleet == nil {
		fleet = MixedFleet
	}
	var out []ScalePoint
	for _, n := range cfg.Sizes {
		if n < 1 {
			return nil, fmt.Errorf("fleet size %d is not positive", n)
		}
		pt := ScalePoint{Servers: n, Rate: cfg.RatePerServer * float64(n)}
		for _, nr := range cfg.Routers {
			c := cfg.Base
			c.Servers, c.Fleet, c.Router = nil, fleet(n), nr.Router
			c.Arrival = loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: pt.Rate}
			res, err := Run(c)
			if err != nil {
				return nil, fmt.Errorf("%d servers, %s: %w", n, nr.Name, err)
			}
			o := res.Summary.Overall
			pt.Results = append(pt.Results, ScaleResult{
				Router: nr.Name, Requests: o.Requests, Succeeded: o.Succeeded, TTFTP50: o.TTFT.P50, TTFTP99: o.TTFT.P99,
				EPPPerRequest: res.EPP.PerRequest(), EPPCPUPerRequest: res.EPP.CPUPerRequest(), PrefixHitRate: res.Fleet.PrefixHitRate(), Virtual: res.Virtual,
				Wall: res.Wall,
			})
		}
		if base := pt.Results[0].TTFTP99; base > 0 {
			for i := range pt.Results {
				pt.Results[i].TTFTP99VsBaseline = float64(pt.Results[i].TTFTP99) / float64(base)
			}
		}
		out = append(out, pt)
	}
	return out, nil
}
