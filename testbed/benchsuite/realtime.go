package benchsuite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
	"github.com/sluice-gw/sluice/testbed/procs"
)

// Defaults of RealTime.
const (
	DefaultSampleEvery    = 500 * time.Millisecond
	DefaultStartupTimeout = time.Minute
	DefaultSettle         = time.Second
)

// RealTimeEngineName is RunResult.Engine of real-time runs.
const RealTimeEngineName = "real-time"

// Binaries RealTime runs from its Bin folder.
const (
	SimulatorBinary = "vllm-sim"
	EPPBinary       = "epp"
	DataPlaneBinary = "dataplane"
)

// RealTime runs a scenario with real processes on 127.0.0.1: a fresh
// simulated fleet (vllm-sim), the EPP in static-endpoints mode unless the
// contender is round-robin, the data plane, and the load generator
// in-process. It samples queue depths while the load runs and reads the
// fleet's and the EPP's counters at the end. Every process is stopped
// before Run returns.
type RealTime struct {
	// Bin holds the vllm-sim, epp and dataplane binaries.
	Bin string
	// OutDir receives one folder per run, <scenario>/<contender>, with the
	// processes' logs and the files given to the EPP.
	OutDir string
	// OnLoadStart, if set, is called when the processes are ready and the
	// load begins; OnRecord sees every attempt as it completes, from many
	// goroutines. Both are for progress display.
	OnLoadStart func()
	OnRecord    func(loadgen.Record)
	// SampleEvery is the queue-depth sampling period (DefaultSampleEvery
	// when zero).
	SampleEvery time.Duration
	// StartupTimeout bounds each process's readiness (DefaultStartupTimeout
	// when zero).
	StartupTimeout time.Duration
	// Settle is the pause between readiness and load, for the EPP's first
	// metrics scrapes (DefaultSettle when zero).
	Settle time.Duration
	// EPPCPUProfile, if set, takes a CPU profile of every EPP replica over
	// the load (from its /debug/pprof/profile) into the run folder as
	// EPPCPUProfileFile (epp-<k>.cpu.pprof with replicas), for
	// `go tool pprof`.
	EPPCPUProfile bool
}

// EPPCPUProfileFile is the name of the EPP's CPU profile in a run folder.
const EPPCPUProfileFile = "epp.cpu.pprof"

var (
	_ Engine             = (*RealTime)(nil)
	_ InterleavingEngine = (*RealTime)(nil)
)

// LocateBinaries returns the absolute folder of vllm-sim, epp and dataplane
// for the test bed's process tests (run from a package two levels below the
// repository): $SLUICE_BENCH_BIN, the folder of $SLUICE_EPP_BINARY (make
// test's bin/), or the repository's bin/; an error when one is missing.
func LocateBinaries() (string, error) {
	dir := filepath.Join("..", "..", "bin")
	if d := os.Getenv("SLUICE_BENCH_BIN"); d != "" {
		dir = d
	} else if epp := os.Getenv("SLUICE_EPP_BINARY"); epp != "" {
		dir = filepath.Dir(epp)
	}
	if err := CheckBinaries(dir); err != nil {
		return "", err
	}
	return filepath.Abs(dir)
}

// CheckBinaries reports the binaries missing from bin.
func CheckBinaries(bin string) error {
	var missing []string
	for _, b := range []string{SimulatorBinary, EPPBinary, DataPlaneBinary} {
		if st, err := os.Stat(filepath.Join(bin, b)); err != nil || st.IsDir() {
			missing = append(missing, filepath.Join(bin, b))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s: run make build", strings.Join(missing, ", "))
	}
	return nil
}

// realRun is the state of one RealTime.Run.
type realRun struct {
	e      *RealTime
	sc     *Scenario
	c      Contender
	dir    string
	client *http.Client
	procs  []*procs.Process

	fleetMetrics []string // the servers' /metrics URLs
	eppMetrics   []string // the EPP replicas' /metrics URLs, none for round-robin
	target       string   // the data plane's base URL
}

// Run implements Engine.
func (e *RealTime) Run(ctx context.Context, sc *Scenario, c Contender) (res *RunResult, err error) {
	if err := CheckBinaries(e.Bin); err != nil {
		return nil, err
	}
	r, err := e.newRun(sc, c)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	if err := r.start(ctx); err != nil {
		return nil, fmt.Errorf("%s/%s: %w", sc.Name, c.Name, err)
	}
	res, err = r.load(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", sc.Name, c.Name, err)
	}
	return res, nil
}

func (e *RealTime) startupTimeout() time.Duration {
	if e.StartupTimeout > 0 {
		return e.StartupTimeout
	}
	return DefaultStartupTimeout
}

// start brings up the fleet, the EPP and the data plane and waits until
// each is ready.
func (r *realRun) start(ctx context.Context) error {
	timeout := r.e.startupTimeout()
	// One block of ports: the fleet's, then the data plane's and each EPP
	// replica's (ext_proc, health, metrics).
	n := r.sc.FleetSize
	replicas := max(1, r.c.Replicas)
	base, err := procs.FreePortRange(n+1+3*replicas, "127.0.0.1")
	if err != nil {
		return err
	}
	endpoints := make([]string, r.sc.FleetSize)
	for i := range endpoints {
		endpoints[i] = "127.0.0.1:" + strconv.Itoa(base+i)
		r.fleetMetrics = append(r.fleetMetrics, "http://"+endpoints[i]+"/metrics")
	}
	simArgs := []string{"--host=127.0.0.1", "--fleet=" + r.sc.Fleet, "--base-port=" + strconv.Itoa(base),
		"--model=" + r.sc.Model, "--seed=1", "--shutdown-timeout=2s"}
	if r.sc.OutputLength != "" {
		simArgs = append(simArgs, "--output-length="+string(r.sc.OutputLength))
	}
	if len(r.sc.Adapters) > 0 {
		mods := make([]string, len(r.sc.Adapters))
		for i, a := range r.sc.Adapters {
			mods[i] = a + "=/adapters/" + a
		}
		simArgs = append(simArgs, "--lora-modules="+strings.Join(mods, ","))
	}
	if _, err := r.startProcess(SimulatorBinary, simArgs...); err != nil {
		return err
	}
	for _, ep := range endpoints {
		if err := procs.WaitReady(ctx, timeout, "simulated server "+ep, r.procs, procs.HTTPOK(r.client, "http://"+ep+"/health")); err != nil {
			return err
		}
	}

	listen := "127.0.0.1:" + strconv.Itoa(base+n)
	r.target = "http://" + listen
	dpArgs := []string{"--listen=" + listen}
	switch r.c.Router {
	case RouterRoundRobin:
		dpArgs = append(dpArgs, "--round-robin", "--endpoints="+strings.Join(endpoints, ","))
	case RouterEPP:
		var grpcs, peers []string
		for k := range replicas {
			peers = append(peers, "127.0.0.1:"+strconv.Itoa(base+n+2+3*k))
		}
		for k := range replicas {
			grpc, health, metrics := base+n+1+3*k, base+n+2+3*k, base+n+3+3*k
			eppArgs, err := r.eppArgs(endpoints, grpc, health, metrics)
			if err != nil {
				return err
			}
			if r.c.EndpointOwnership {
				// The replicas partition the endpoints (the EPP's --peers); each names itself by its health port.
				eppArgs = append(eppArgs, "--peers="+strings.Join(peers, ","))
				if !r.c.PeerExchange {
					eppArgs = append(eppArgs, "--peer-exchange-interval=0") // ownership alone
				}
			}
			log := EPPBinary
			if replicas > 1 {
				log = fmt.Sprintf("%s-%d", EPPBinary, k)
			}
			if _, err := r.startProcessLogged(EPPBinary, log, eppArgs...); err != nil {
				return err
			}
			url := fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics)
			if err := procs.WaitReady(ctx, timeout, "EPP replica "+strconv.Itoa(k), r.procs, procs.HTTPOK(r.client, url)); err != nil {
				return err
			}
			r.eppMetrics = append(r.eppMetrics, url)
			grpcs = append(grpcs, "127.0.0.1:"+strconv.Itoa(grpc))
		}
		dpArgs = append(dpArgs, "--epp="+strings.Join(grpcs, ","))
		if r.c.RequestBodyMode != "" {
			dpArgs = append(dpArgs, "--request-body-mode="+r.c.RequestBodyMode)
		}
		if r.c.ResponseObserver {
			dpArgs = append(dpArgs, "--response-observer")
		}
		if r.c.Balance != "" {
			dpArgs = append(dpArgs, "--epp-balance="+r.c.Balance)
		}
	default:
		return fmt.Errorf("contender %s: unknown router %q", r.c.Name, r.c.Router)
	}
	if _, err := r.startProcess(DataPlaneBinary, dpArgs...); err != nil {
		return err
	}
	if err := procs.WaitReady(ctx, timeout, "the data plane", r.procs, procs.TCPAccepts(listen)); err != nil {
		return err
	}
	settle := r.e.Settle
	if settle == 0 {
		settle = DefaultSettle
	}
	return loadgen.Sleep(ctx, settle)
}

// responseObserverWait is the EPP's --response-observer-wait for a contender with ResponseObserver: the data plane
// opens the observer stream right after it closes the routing stream, so any wait will do; this one is the EPP
// flag's own example.
const responseObserverWait = 2 * time.Second

// eppArgs writes the contender's files into the run folder and returns the
// EPP's flags.
func (r *realRun) eppArgs(endpoints []string, grpc, health, metrics int) ([]string, error) {
	args := []string{
		"--static-endpoints=" + strings.Join(endpoints, ","),
		"--secure-serving=false", "--tracing=false",
		"--grpc-port=" + strconv.Itoa(grpc),
		"--grpc-health-port=" + strconv.Itoa(health),
		"--metrics-port=" + strconv.Itoa(metrics),
	}
	files := []struct {
		content []byte
		name    string
		flag    string
	}{
		{r.c.EndpointPickerConfig, "epp-config.yaml", "--config-file"},
		{r.c.FlowControlPolicy, "flow-control-policy.yaml", "--flow-control-config"},
		{r.sc.Objectives, "objectives.yaml", "--inference-objectives-file"},
	}
	for _, f := range files {
		if f.content == nil {
			continue
		}
		path := filepath.Join(r.dir, f.name)
		if err := os.WriteFile(path, f.content, 0o644); err != nil {
			return nil, err
		}
		args = append(args, f.flag+"="+path)
	}
	if r.c.SluiceAdmission {
		args = append(args, "--sluice-admission")
	}
	if r.c.ResponseObserver {
		args = append(args, "--response-observer-wait="+responseObserverWait.String())
	}
	return args, nil
}

func (r *realRun) startProcess(bin string, args ...string) (*procs.Process, error) {
	return r.startProcessLogged(bin, bin, args...)
}

// startProcessLogged starts bin with its output in <log>.log.
func (r *realRun) startProcessLogged(bin, log string, args ...string) (*procs.Process, error) {
	p, err := procs.Start(bin, filepath.Join(r.dir, log+".log"), filepath.Join(r.e.Bin, bin), args...)
	if err != nil {
		return nil, err
	}
	r.procs = append(r.procs, p)
	return p, nil
}

// load runs the load generator while sampling queue depths, then reads the
// counters.
func (r *realRun) load(ctx context.Context) (*RunResult, error) {
	mix, arrival := r.sc.Load(r.c)
	res, err := r.e.measure(ctx, []*realRun{r}, r.loadConfig(mix, arrival))
	if err != nil {
		return nil, err
	}
	return res[0], nil
}

// newRun prepares the run of c on sc: its folder, and a client for its processes' endpoints.
func (e *RealTime) newRun(sc *Scenario, c Contender) (*realRun, error) {
	dir := filepath.Join(e.OutDir, sc.Name, c.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return &realRun{e: e, sc: sc, c: c, dir: dir, client: &http.Client{Timeout: 2 * time.Second}}, nil
}

// stop stops the run's processes, last started first (the data plane, the EPP, the fleet), and closes its client's
// idle connections.
func (r *realRun) stop() {
	for i := len(r.procs) - 1; i >= 0; i-- {
		r.procs[i].Stop()
	}
	r.client.CloseIdleConnections()
}

// loadConfig is the load generator's configuration for this run's
// scenario, to its data plane.
func (r *realRun) loadConfig(mix *loadgen.Mix, arrival loadgen.ArrivalConfig) loadgen.RunConfig {
	return loadgen.RunConfig{
		Target:   r.target,
		Mix:      mix,
		Seed:     r.sc.Seed,
		Mode:     loadgen.ModeOpen,
		Arrival:  arrival,
		Duration: r.sc.Duration,
		Drain:    r.sc.Drain,
		Retry:    r.sc.Retry,
		SLO:      r.sc.SLO,
		OnRecord: r.e.OnRecord,
	}
}

// RunInterleaved implements InterleavingEngine: every contender's fleet,
// EPP and data plane start (one after another) and stay up together; one
// load generator deals the requests among their data planes in turns,
// at len(cs) times the scenario's arrival rate, so that each contender gets
// the scenario's rate; each contender's result holds its own requests, its
// own processes' CPU, samples and profiles over the same window.
func (e *RealTime) RunInterleaved(ctx context.Context, sc *Scenario, cs []Contender) ([]*RunResult, error) {
	if err := CheckBinaries(e.Bin); err != nil {
		return nil, err
	}
	runs := make([]*realRun, 0, len(cs))
	defer func() {
		for i := len(runs) - 1; i >= 0; i-- {
			runs[i].stop()
		}
	}()
	for _, c := range cs {
		if c.Unloaded {
			return nil, fmt.Errorf("%s/%s: the unloaded reference has its own load and is not interleaved", sc.Name, c.Name)
		}
		r, err := e.newRun(sc, c)
		if err != nil {
			return nil, err
		}
		runs = append(runs, r)
		if err := r.start(ctx); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", sc.Name, c.Name, err)
		}
	}
	cfg := runs[0].loadConfig(sc.Mix, scaleArrival(sc.Arrival, float64(len(runs))))
	cfg.Target = ""
	for _, r := range runs {
		cfg.Targets = append(cfg.Targets, r.target)
	}
	res, err := e.measure(ctx, runs, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s (interleaved): %w", sc.Name, err)
	}
	return res, nil
}

// scaleArrival multiplies an arrival process's rates by k.
func scaleArrival(a loadgen.ArrivalConfig, k float64) loadgen.ArrivalConfig {
	a.Rate *= k
	a.Phases = slices.Clone(a.Phases)
	for i := range a.Phases {
		a.Phases[i].Rate *= k
	}
	return a
}

// measure runs one load through runs' data planes (cfg's Target, or its
// Targets in runs' order) while sampling each run's queue depths and,
// if asked, profiling its EPPs, then gives each run its result: its own
// records (Record.Target) and summary, and its processes' CPU and counters.
func (e *RealTime) measure(ctx context.Context, runs []*realRun, cfg loadgen.RunConfig) ([]*RunResult, error) {
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	if e.OnLoadStart != nil {
		e.OnLoadStart()
	}
	began := time.Now()
	cpuBefore := make([]map[*procs.Process]time.Duration, len(runs))
	cpuErr := make([]error, len(runs))
	for i, r := range runs {
		cpuBefore[i], cpuErr[i] = r.cpu()
	}
	samples := make([][]QueueSample, len(runs))
	profiled := make([]error, len(runs))
	var sampling, profiling sync.WaitGroup
	for i, r := range runs {
		sampling.Go(func() { samples[i] = r.sample(sampleCtx, began) })
		if e.EPPCPUProfile {
			profiling.Go(func() { profiled[i] = r.profileEPPs(ctx) })
		}
	}
	lg, err := loadgen.Run(ctx, cfg)
	stopSampling()
	sampling.Wait()
	profiling.Wait()
	if perr := errors.Join(profiled...); perr != nil && err == nil {
		err = fmt.Errorf("profiling the EPP: %w", perr)
	}
	cpuAfter := make([]map[*procs.Process]time.Duration, len(runs))
	for i, r := range runs {
		var aerr error
		cpuAfter[i], aerr = r.cpu()
		cpuErr[i] = errors.Join(cpuErr[i], aerr)
	}
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, r := range runs {
		for _, p := range r.procs {
			if p.Exited() {
				return nil, fmt.Errorf("%s, during the load: %w", r.c.Name, p.ExitError())
			}
		}
	}
	wall := time.Since(began)
	out := make([]*RunResult, len(runs))
	for i, r := range runs {
		records, summary := lg.Records, lg.Summary
		if len(runs) > 1 {
			records = recordsThrough(lg.Records, i)
			slos := map[string]loadgen.SLO{}
			for _, c := range cfg.Mix.Classes {
				slos[c.Name] = c.SLO
			}
			summary = loadgen.Summarize(records, loadgen.SummaryOptions{Duration: lg.Summary.Duration, SLOs: slos, DefaultSLO: cfg.SLO})
		}
		res := &RunResult{
			Scenario: r.sc.Name, Contender: r.c.Name, Describe: r.c.Describe(), Engine: RealTimeEngineName,
			Started: lg.Started, Wall: wall, Summary: summary, Records: records,
			Samples: samples[i], LogDir: r.dir,
		}
		if cpuErr[i] == nil {
			res.CPU = &ProcessCPU{}
			for _, p := range r.procs {
				used := cpuAfter[i][p] - cpuBefore[i][p]
				switch p.Name {
				case SimulatorBinary:
					res.CPU.Fleet += used
				case EPPBinary:
					res.CPU.EPP += used
				case DataPlaneBinary:
					res.CPU.DataPlane += used
				}
			}
		}
		if res.Fleet, err = r.fleetCounters(ctx); err != nil {
			return nil, err
		}
		if len(r.eppMetrics) > 0 {
			page, err := ScrapeMerged(ctx, r.client, r.eppMetrics)
			if err != nil {
				return nil, fmt.Errorf("reading the EPP's counters: %w", err)
			}
			res.Admission = admissionCounters(page)
		}
		out[i] = res
	}
	return out, nil
}

// recordsThrough returns the records of the requests sent through target k.
func recordsThrough(records []loadgen.Record, k int) []loadgen.Record {
	var out []loadgen.Record
	for _, r := range records {
		if r.Target == k {
			out = append(out, r)
		}
	}
	return out
}

// profileEPPs saves each EPP replica's CPU profile over the load's
// duration (the scenario's, without the drain) into the run folder.
func (r *realRun) profileEPPs(ctx context.Context) error {
	seconds := max(1, int(r.sc.Duration.Seconds()))
	client := &http.Client{Timeout: time.Duration(seconds)*time.Second + time.Minute}
	defer client.CloseIdleConnections()
	errs := make([]error, len(r.eppMetrics))
	var wg sync.WaitGroup
	for k, metrics := range r.eppMetrics {
		file := EPPCPUProfileFile
		if len(r.eppMetrics) > 1 {
			file = fmt.Sprintf("epp-%d.cpu.pprof", k)
		}
		url := strings.TrimSuffix(metrics, "/metrics") + "/debug/pprof/profile?seconds=" + strconv.Itoa(seconds)
		wg.Go(func() { errs[k] = SaveURL(ctx, client, url, filepath.Join(r.dir, file)) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// SaveURL writes the body of a GET of url to path.
func SaveURL(ctx context.Context, client *http.Client, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, body, 0o644)
}

// cpu reads the CPU time each process has used so far.
func (r *realRun) cpu() (map[*procs.Process]time.Duration, error) {
	used := make(map[*procs.Process]time.Duration, len(r.procs))
	for _, p := range r.procs {
		d, err := p.CPU()
		if err != nil {
			return nil, err
		}
		used[p] = d
	}
	return used, nil
}

// sample reads queue depths every SampleEvery until ctx ends. A failed
// scrape skips that instant: a loaded machine may answer late.
func (r *realRun) sample(ctx context.Context, began time.Time) []QueueSample {
	every := r.e.SampleEvery
	if every <= 0 {
		every = DefaultSampleEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var out []QueueSample
	for {
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
		s := QueueSample{At: time.Since(began)}
		ok := true
		for _, u := range r.fleetMetrics {
			page, err := Scrape(ctx, r.client, u)
			if err != nil {
				ok = false
				break
			}
			s.ServerWaiting += page.Sum(metricServerWaiting)
			s.ServerRunning += page.Sum(metricServerRunning)
		}
		if ok && len(r.eppMetrics) > 0 {
			page, err := ScrapeMerged(ctx, r.client, r.eppMetrics)
			if err != nil {
				ok = false
			} else {
				s.EPPQueued = eppQueued(page)
				s.EPPStaleEndpoints = eppStaleEndpoints(page)
			}
		}
		if ok {
			out = append(out, s)
		}
	}
}

func (r *realRun) fleetCounters(ctx context.Context) (FleetCounters, error) {
	var f FleetCounters
	for _, u := range r.fleetMetrics {
		page, err := Scrape(ctx, r.client, u)
		if err != nil {
			return f, fmt.Errorf("reading the fleet's counters: %w", err)
		}
		f.PrefixHitTokens += page.Sum(metricPrefixHits)
		f.PrefixQueryTokens += page.Sum(metricPrefixQueries)
		f.AdapterLoads += page.Sum(metricAdapterLoads)
		f.Preemptions += page.Sum(metricPreemptions)
	}
	return f, nil
}
