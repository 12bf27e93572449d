package benchsuite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
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

var _ Engine = (*RealTime)(nil)

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
	dir := filepath.Join(e.OutDir, sc.Name, c.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	r := &realRun{e: e, sc: sc, c: c, dir: dir, client: &http.Client{Timeout: 2 * time.Second}}
	defer r.client.CloseIdleConnections()
	defer func() {
		// Last started, first stopped: the data plane, the EPP, the fleet.
		for i := len(r.procs) - 1; i >= 0; i-- {
			r.procs[i].Stop()
		}
	}()
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
	cfg := loadgen.RunConfig{
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
	sampleCtx, stopSampling := context.WithCancel(ctx)
	if r.e.OnLoadStart != nil {
		r.e.OnLoadStart()
	}
	began := time.Now()
	cpuBefore, cpuErr := r.cpu()
	var samples []QueueSample
	var wg sync.WaitGroup
	wg.Go(func() { samples = r.sample(sampleCtx, began) })
	profiled := make(chan error, 1)
	if r.e.EPPCPUProfile {
		go func() { profiled <- r.profileEPPs(ctx) }()
	} else {
		profiled <- nil
	}
	lg, err := loadgen.Run(ctx, cfg)
	stopSampling()
	wg.Wait()
	if perr := <-profiled; perr != nil && err == nil {
		err = fmt.Errorf("profiling the EPP: %w", perr)
	}
	cpuAfter, cpuAfterErr := r.cpu()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, p := range r.procs {
		if p.Exited() {
			return nil, fmt.Errorf("during the load: %w", p.ExitError())
		}
	}
	res := &RunResult{
		Scenario: r.sc.Name, Contender: r.c.Name, Describe: r.c.Describe(), Engine: RealTimeEngineName,
		Started: lg.Started, Wall: time.Since(began), Summary: lg.Summary, Records: lg.Records,
		Samples: samples, LogDir: r.dir,
	}
	if cpuErr == nil && cpuAfterErr == nil {
		res.CPU = &ProcessCPU{}
		for _, p := range r.procs {
			used := cpuAfter[p] - cpuBefore[p]
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
	return res, nil
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
		wg.Go(func() { errs[k] = saveURL(ctx, client, url, filepath.Join(r.dir, file)) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// saveURL writes the body of a GET of url to path.
func saveURL(ctx context.Context, client *http.Client, url, path string) error {
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
