package chaos

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/runner"
	"github.com/sluice-gw/sluice/testbed/benchsuite"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// SoakOptions configure a soak.
type SoakOptions struct {
	// Load is how long the overload lasts; Factor the offered rate over
	// the fleet's capacity, which a closed-loop run of Calibrate measures
	// first.
	Load      time.Duration
	Factor    float64
	Calibrate time.Duration
	// CoolDown is the idle time after the load before the EPP's figures
	// are compared with their baseline (Go returns freed memory to the
	// system over minutes).
	CoolDown time.Duration
	// SampleEvery is the period of the EPP's samples; ProbeEvery that of
	// the cardinality probe (one request with a tenant and a model no one
	// sent before).
	SampleEvery, ProbeEvery time.Duration
	// LabelWarmUp is how many requests, each with a tenant and a model no
	// one sent before, the warm-up sends (at WarmUpRate per second) before
	// the baseline: enough to fill the EPP's bounded label spaces
	// (--metrics-max-label-values), which the probe fills during the load
	// anyway. A baseline taken before them measures an EPP that has not
	// yet made room for the series it keeps by design.
	LabelWarmUp int
	WarmUpRate  float64
}

// DefaultSoakOptions is `make soak`'s soak of the given length.
func DefaultSoakOptions(load time.Duration) SoakOptions {
	return SoakOptions{Load: load, Factor: 3, Calibrate: 30 * time.Second, CoolDown: 2 * time.Minute,
		SampleEvery: 2 * time.Second, ProbeEvery: 200 * time.Millisecond,
		LabelWarmUp: runner.DefaultMaxLabelValues + 44, WarmUpRate: 20}
}

// Soak thresholds, fixed before any soak ran: after the cool-down the EPP's
// goroutines are back within 10% (+10) of their idle baseline and its RSS
// within 25%; between the middle and the end of the load no metric family
// gains more than maxSeriesGrowth series while the probe adds a new tenant
// and model every ProbeEvery.
const (
	goroutineSlack  = 0.10
	goroutineExtra  = 10
	rssSlack        = 0.25
	maxSeriesGrowth = 5
)

// SoakSample is the EPP's state at one instant.
type SoakSample struct {
	At         time.Duration `json:"at_ns"` // from the start of the load
	RSS        float64       `json:"rss_bytes"`
	HeapInuse  float64       `json:"heap_inuse_bytes"`
	Goroutines float64       `json:"goroutines"`
	Series     int           `json:"series"`
	Queued     float64       `json:"queued"`
	families   map[string]int
}

// SoakResult is what a soak measured.
type SoakResult struct {
	Capacity float64 `json:"capacity_rps"` // measured, requests/s
	Offered  float64 `json:"offered_rps"`
	// Requests counts the load's requests (their final answers), Attempts
	// every attempt (retries after Retry-After included).
	Requests int             `json:"requests"`
	Attempts int             `json:"attempts"`
	Outcomes map[Outcome]int `json:"outcomes"`
	Missing  int             `json:"missing_finals"`
	// Probes counts the cardinality probe's requests and their answers by
	// status ("hung" for none).
	Probes       int            `json:"probes"`
	WarmUpProbes int            `json:"warmup_probes"`
	ProbeAnswers map[string]int `json:"probe_answers"`
	// Cold is the idle EPP after the capacity run, before the label
	// warm-up; Baseline the idle EPP after it, just before the load; Peak
	// the largest figures during the load and the cool-down, After the idle
	// EPP after the cool-down.
	Cold     SoakSample `json:"cold"`
	Baseline SoakSample `json:"baseline"`
	Peak     SoakSample `json:"peak"`
	After    SoakSample `json:"after"`
	// SeriesGrowth lists the metric families that gained series between
	// the middle and the end of the load, with their growth.
	SeriesGrowth map[string]int `json:"series_growth,omitempty"`
	// LogBytesPerRequest is the EPP's log output during the load per
	// request, and per attempt.
	LogBytesPerRequest float64 `json:"epp_log_bytes_per_request"`
	LogBytesPerAttempt float64 `json:"epp_log_bytes_per_attempt"`
	Leak               string  `json:"leak,omitempty"`

	Samples []SoakSample `json:"samples"`
	// Unfinished lists every attempt of the requests whose final answer
	// was not one of 200, 429+RA, 503+RA, for diagnosis.
	Unfinished []loadgen.Record `json:"unfinished,omitempty"`
	Records    []loadgen.Record `json:"-"`
	Load       time.Duration    `json:"load_ns"`
}

// Failures lists how the soak failed its checks.
func (r SoakResult) Failures() []string {
	var out []string
	if n := r.Missing + r.Outcomes[OutcomeLost] + r.Outcomes[OutcomeHung] + r.Outcomes[OutcomeOther]; n > 0 {
		out = append(out, fmt.Sprintf("%d requests did not end in exactly one of 200, 429+RA, 503+RA (%d without a final answer, outcomes %v)",
			n, r.Missing, r.Outcomes))
	}
	if n := r.ProbeAnswers["hung"] + r.ProbeAnswers["lost"]; n > 0 {
		out = append(out, fmt.Sprintf("%d probe requests got no answer", n))
	}
	if limit := r.Baseline.Goroutines*(1+goroutineSlack) + goroutineExtra; r.After.Goroutines > limit {
		out = append(out, fmt.Sprintf("goroutines %v after the cool-down, baseline %v (limit %.0f)", r.After.Goroutines, r.Baseline.Goroutines, limit))
	}
	if limit := r.Baseline.RSS * (1 + rssSlack); r.After.RSS > limit {
		out = append(out, fmt.Sprintf("RSS %.1f MiB after the cool-down, baseline %.1f MiB (limit %.1f MiB)", mib(r.After.RSS), mib(r.Baseline.RSS), mib(limit)))
	}
	for fam, n := range r.SeriesGrowth {
		if n > maxSeriesGrowth {
			out = append(out, fmt.Sprintf("metric %s gained %d series in the second half of the load", fam, n))
		}
	}
	if r.Leak != "" {
		out = append(out, "leak: "+r.Leak)
	}
	return out
}

func mib(b float64) float64 { return b / (1 << 20) }

// calibrationUsers keeps every server's slots and waiting queue full in the
// capacity run: 3 servers of 4 slots, with room to wait.
const calibrationUsers = 36

// Soak measures the fleet's capacity, then offers Factor times it for Load
// with all three bands from clients that honour Retry-After, a cardinality
// probe beside it, sampling the EPP throughout and through a cool-down.
func Soak(t *testing.T, base StackOptions, o SoakOptions) SoakResult {
	t.Helper()
	base.Mode = Static
	s := StartStack(t, base)
	ctx := t.Context()
	if err := s.WaitFresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	capacity := s.calibrate(t, o.Calibrate)
	t.Logf("measured capacity: %.1f requests/s", capacity)
	res := SoakResult{Capacity: capacity, Offered: o.Factor * capacity, Load: o.Load, ProbeAnswers: map[string]int{}}
	idle := func(what string) SoakSample {
		t.Helper()
		if err := loadgen.Sleep(ctx, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		smp, err := s.sample(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.saveHeapProfile(ctx, what); err != nil {
			t.Logf("no heap profile %s: %v", what, err)
		}
		return smp
	}
	res.Cold = idle("cold")
	warmCtx, stopWarmUp := context.WithTimeout(ctx, time.Duration(float64(o.LabelWarmUp)/o.WarmUpRate*float64(time.Second)))
	for _, n := range s.probe(warmCtx, "warmup", time.Duration(float64(time.Second)/o.WarmUpRate)) {
		res.WarmUpProbes += n
	}
	stopWarmUp()
	res.Baseline = idle("baseline")
	var err error

	mix, err := loadgen.ParseMix([]byte(mixYAML))
	if err != nil {
		t.Fatal(err)
	}
	// The drain outlasts a whole retry chain: a request issued as the load ends may wait out three
	// Retry-Afters (a minute each at most) before its last attempt. With a drain of one request timeout,
	// the run itself cut such last attempts mid-stream and counted them hung.
	retry := loadgen.RetryPolicy{MaxAttempts: 4, MaxWait: time.Minute}
	const requestTimeout = 2 * time.Minute
	cfg := loadgen.RunConfig{Target: s.Target, Mix: mix, Seed: 7, Mode: loadgen.ModeOpen,
		Arrival: loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: res.Offered}, Duration: o.Load,
		RequestTimeout: requestTimeout, Drain: time.Duration(retry.MaxAttempts-1)*retry.MaxWait + requestTimeout,
		Retry: retry}
	began := time.Now()
	sampleCtx, stopSampling := context.WithCancel(ctx)
	samples := make(chan []SoakSample, 1)
	go func() { samples <- s.sampleEvery(sampleCtx, began, o.SampleEvery) }()
	probeCtx, stopProbes := context.WithTimeout(ctx, o.Load)
	defer stopProbes()
	probes := make(chan map[string]int, 1)
	go func() { probes <- s.probe(probeCtx, "probe", o.ProbeEvery) }()
	logBefore := len(s.EPP.Output.String())
	lg, err := loadgen.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	logBytes := len(s.EPP.Output.String()) - logBefore
	res.ProbeAnswers = <-probes
	for _, n := range res.ProbeAnswers {
		res.Probes += n
	}
	if err := s.WaitDrained(ctx, drainTimeout); err != nil {
		res.Leak = err.Error()
	}
	if err := loadgen.Sleep(ctx, o.CoolDown); err != nil {
		t.Fatal(err)
	}
	stopSampling()
	res.Samples = <-samples
	if res.After, err = s.sample(ctx, time.Since(began)); err != nil {
		t.Fatal(err)
	}
	if err := s.saveHeapProfile(ctx, "after"); err != nil {
		t.Logf("no heap profile after: %v", err)
	}
	res.Samples = append(res.Samples, res.After)

	res.Records = lg.Records
	res.Outcomes = map[Outcome]int{}
	res.Missing = MissingFinals(lg.Records)
	bad := map[int]bool{}
	for _, r := range lg.Records {
		res.Attempts++
		if r.Final {
			res.Requests++
			o := Classify(r)
			res.Outcomes[o]++
			bad[r.Seq] = o != OutcomeOK && o != OutcomeShed && o != OutcomeUnavailable
		}
	}
	for _, r := range lg.Records {
		if bad[r.Seq] {
			res.Unfinished = append(res.Unfinished, r)
		}
	}
	if res.Requests > 0 {
		res.LogBytesPerRequest = float64(logBytes) / float64(res.Requests)
		res.LogBytesPerAttempt = float64(logBytes) / float64(res.Attempts)
	}
	res.Peak, res.SeriesGrowth = peakAndGrowth(res.Samples, o.Load)
	return res
}

// calibrate runs closed-loop Critical traffic (never shed) that keeps every
// server busy and returns the fleet's throughput in requests/s.
func (s *Stack) calibrate(t *testing.T, d time.Duration) float64 {
	t.Helper()
	mix, err := loadgen.ParseMix([]byte(mixYAML))
	if err != nil {
		t.Fatal(err)
	}
	mix.Classes = mix.Classes[:1] // critical
	res, err := loadgen.Run(t.Context(), loadgen.RunConfig{Target: s.Target, Mix: mix, Seed: 3, Mode: loadgen.ModeClosed,
		Users: calibrationUsers, Duration: d, RequestTimeout: time.Minute, Drain: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ok := 0
	for _, r := range res.Records {
		if r.Final && r.OK() {
			ok++
		}
	}
	if ok == 0 {
		t.Fatalf("the capacity run served nothing: %+v", res.Summary.Overall)
	}
	return float64(ok) / d.Seconds()
}

// sample reads the EPP's state.
func (s *Stack) sample(ctx context.Context, at time.Duration) (SoakSample, error) {
	page, err := s.EPPMetrics(ctx)
	if err != nil {
		return SoakSample{}, err
	}
	smp := SoakSample{At: at, RSS: page.Sum("process_resident_memory_bytes"), HeapInuse: page.Sum("go_memstats_heap_inuse_bytes"),
		Goroutines: page.Sum("go_goroutines"),
		Queued:     page.Sum("sluice_flowcontrol_queue_length"), families: map[string]int{}}
	for name, fam := range page {
		smp.families[name] = len(fam.GetMetric())
		smp.Series += len(fam.GetMetric())
	}
	return smp, nil
}

// sampleEvery samples the EPP every period until ctx ends; a failed scrape
// skips that instant (a loaded machine may answer late).
func (s *Stack) sampleEvery(ctx context.Context, began time.Time, period time.Duration) []SoakSample {
	tick := time.NewTicker(period)
	defer tick.Stop()
	var out []SoakSample
	for {
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
		if smp, err := s.sample(ctx, time.Since(began)); err == nil {
			out = append(out, smp)
		}
	}
}

// probe sends, every period until ctx ends, one request with a tenant and a
// model no one sent before (named after prefix and a count), as a buggy or
// hostile client would, and counts the answers by status: if a metric label
// took either, its series would grow without bound.
func (s *Stack) probe(ctx context.Context, prefix string, period time.Duration) map[string]int {
	client := loadgen.NewLoopbackClient()
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	answers := map[string]int{}
	var wg sync.WaitGroup
	tick := time.NewTicker(period)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			wg.Wait()
			return answers
		case <-tick.C:
		}
		wg.Go(func() {
			status := probeOnce(client, s.Target, prefix, n)
			mu.Lock()
			answers[status]++
			mu.Unlock()
		})
	}
}

func probeOnce(client *http.Client, target, prefix string, n int) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	body := fmt.Sprintf(`{"model":"%s-model-%d","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`, prefix, n)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/v1/chat/completions", bytes.NewBufferString(body))
	if err != nil {
		return "lost"
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-gateway-inference-fairness-id", prefix+"-tenant-"+strconv.Itoa(n))
	resp, err := client.Do(req)
	switch {
	case ctx.Err() != nil:
		return "hung"
	case err != nil:
		return "lost"
	}
	_ = resp.Body.Close()
	return strconv.Itoa(resp.StatusCode)
}

// saveHeapProfile writes the EPP's heap profile (pprof, on its metrics port)
// into the run's log folder as heap-<what>.pb.gz, for `go tool pprof
// -diff_base` between two instants.
func (s *Stack) saveHeapProfile(ctx context.Context, what string) error {
	return benchsuite.SaveURL(ctx, s.client, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?gc=1", s.EPP.MetricsPort),
		filepath.Join(s.opts.Dir, "heap-"+what+".pb.gz"))
}

// peakAndGrowth returns the largest figures of the samples and, per metric
// family, the series it gained between the middle and the end of the load.
func peakAndGrowth(samples []SoakSample, load time.Duration) (SoakSample, map[string]int) {
	var peak SoakSample
	var mid, end *SoakSample
	for i := range samples {
		smp := &samples[i]
		peak.RSS, peak.Goroutines = max(peak.RSS, smp.RSS), max(peak.Goroutines, smp.Goroutines)
		peak.Series, peak.Queued = max(peak.Series, smp.Series), max(peak.Queued, smp.Queued)
		if smp.At <= load/2 {
			mid = smp
		}
		if smp.At <= load {
			end = smp
		}
	}
	growth := map[string]int{}
	if mid == nil || end == nil {
		return peak, growth
	}
	for fam, n := range end.families {
		if d := n - mid.families[fam]; d > 0 {
			growth[fam] = d
		}
	}
	return peak, growth
}
