package benchsuite

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
	"github.com/sluice-gw/sluice/testbed/virtualbench"
)

// ScaleName names the scale study where a scenario name would go: its
// section of the report and its folder of plots.
const ScaleName = "scale"

// Defaults of ScaleOptions: virtualbench.BenchmarkScale's, so the two agree.
const (
	// DefaultScaleRatePerServer is 30 req/s on a 2+2 fleet, the load
	// virtualbench's agreement with real time was measured at.
	DefaultScaleRatePerServer = 7.5
	DefaultScaleDuration      = 5 * time.Second
)

// DefaultScaleSizes are the fleet sizes of the scale study. An EPP
// contender takes minutes at 1000 servers: its decisions cost milliseconds
// of wall time there.
var DefaultScaleSizes = []int{8, 64, 256, 1000}

// scaleMix is the mixed-gpu scenario's load: 512-token prompts, 128-token
// streamed answers.
const scaleMix = `
api: chat
stream: true
classes:
  - {name: chat, model: ` + virtualbench.DefaultModel + `, prompt_tokens: 512, output_tokens: 128}
`

// ScaleOptions describe a scale study: the same load per server on mixed
// fleets (virtualbench.MixedFleet: half H100-like, half A10G-like) of
// growing size, run by round-robin, upstream-default and sluice (Sluice's
// default profile and policy) in virtual time.
type ScaleOptions struct {
	// Sizes are the fleet sizes (DefaultScaleSizes when empty).
	Sizes []int
	// RatePerServer is the Poisson arrival rate per server
	// (DefaultScaleRatePerServer when zero).
	RatePerServer float64
	// Duration is the virtual issuing window (DefaultScaleDuration when
	// zero).
	Duration time.Duration
	// Seed seeds the load and the EPPs (DefaultSeed when zero).
	Seed uint64
	// OnRun, if set, is told about every run as it starts; OnPoint sees
	// every fleet size as it finishes. Both are for progress display.
	OnRun   func(servers int, contender string)
	OnPoint func(virtualbench.ScalePoint)
}

// ScaleStudy is a finished scale study.
type ScaleStudy struct {
	Fleet         string        `json:"fleet"`
	Mix           string        `json:"mix"`
	RatePerServer float64       `json:"rate_per_server"`
	Duration      time.Duration `json:"duration_ns"`
	Seed          uint64        `json:"seed"`
	// Contenders are the routers in run order; the first is the baseline of
	// every TTFTP99VsBaseline.
	Contenders []string                  `json:"contenders"`
	Points     []virtualbench.ScalePoint `json:"points"`
	Wall       time.Duration             `json:"wall_ns"`
}

func (o ScaleOptions) withDefaults() (ScaleOptions, error) {
	if len(o.Sizes) == 0 {
		o.Sizes = DefaultScaleSizes
	}
	for _, n := range o.Sizes {
		if n < 1 {
			return o, fmt.Errorf("scale study: fleet size %d is not positive", n)
		}
	}
	if o.RatePerServer == 0 {
		o.RatePerServer = DefaultScaleRatePerServer
	}
	if !(o.RatePerServer > 0) {
		return o, fmt.Errorf("scale study: rate per server must be positive, got %v", o.RatePerServer)
	}
	if o.Duration == 0 {
		o.Duration = DefaultScaleDuration
	}
	if o.Duration < 0 {
		return o, fmt.Errorf("scale study: duration must be positive, got %v", o.Duration)
	}
	if o.Seed == 0 {
		o.Seed = DefaultSeed
	}
	return o, nil
}

// RunScale runs the scale study one fleet size at a time, contenders one
// after the other so that each EPP's wall time per decision is measured
// alone. Cancelling ctx stops it between runs; the study then holds the
// sizes finished so far and the error is ctx's.
func RunScale(ctx context.Context, opts ScaleOptions) (*ScaleStudy, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	mix, err := loadgen.ParseMix([]byte(scaleMix))
	if err != nil {
		return nil, err
	}
	routers := []virtualbench.NamedRouter{
		{Name: RoundRobin, Router: virtualbench.RoundRobinRouter()},
		{Name: UpstreamDefault, Router: virtualbench.UpstreamRouter()},
		{Name: Sluice, Router: virtualbench.SluiceRouter(nil, nil)},
	}
	study := &ScaleStudy{
		Fleet: "half h100, half a10g", Mix: "512/128-token streaming chats",
		RatePerServer: opts.RatePerServer, Duration: opts.Duration, Seed: opts.Seed,
	}
	for _, r := range routers {
		study.Contenders = append(study.Contenders, r.Name)
	}
	began := time.Now()
	defer func() { study.Wall = time.Since(began) }()
	base := virtualbench.Config{Mix: mix, Seed: opts.Seed, Duration: opts.Duration, ServerSeed: 1, DiscardITL: true}
	for _, n := range opts.Sizes {
		// One run per call, so that cancelling waits for one run at most.
		var pt virtualbench.ScalePoint
		for _, r := range routers {
			if err := ctx.Err(); err != nil {
				return study, err
			}
			if opts.OnRun != nil {
				opts.OnRun(n, r.Name)
			}
			pts, err := virtualbench.Scale(virtualbench.ScaleConfig{
				Base: base, Sizes: []int{n}, RatePerServer: opts.RatePerServer, Routers: []virtualbench.NamedRouter{r},
			})
			if err != nil {
				return study, fmt.Errorf("scale study: %w", err)
			}
			pt.Servers, pt.Rate = pts[0].Servers, pts[0].Rate
			pt.Results = append(pt.Results, pts[0].Results...)
		}
		// Round-robin is the baseline; a ratio to a baseline without a
		// single success is undefined (0).
		baseline := pt.Results[0].TTFTP99
		for i := range pt.Results {
			pt.Results[i].TTFTP99VsBaseline = 0
			if baseline > 0 {
				pt.Results[i].TTFTP99VsBaseline = float64(pt.Results[i].TTFTP99) / float64(baseline)
			}
		}
		study.Points = append(study.Points, pt)
		if opts.OnPoint != nil {
			opts.OnPoint(pt)
		}
	}
	return study, nil
}

// Result returns the named contender's result at point i.
func (s *ScaleStudy) Result(i int, contender string) (virtualbench.ScaleResult, bool) {
	for _, r := range s.Points[i].Results {
		if r.Router == contender {
			return r, true
		}
	}
	return virtualbench.ScaleResult{}, false
}
