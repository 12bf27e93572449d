// Command vllm-sim runs one or more simulated vLLM servers in one process,
// each on its own port with its own engine, metrics registry and faults.
// See package github.com/sluice-gw/sluice/testbed/simulator for the model.
//
//	vllm-sim --port 8000                                # one H100-like server
//	vllm-sim --port 8001 --replicas 4                   # 8001..8004
//	vllm-sim --ports 8001-8004 --profile a10g
//	vllm-sim --fleet h100:2,a10g:2 --base-port 8001     # mixed fleet
//	vllm-sim --fleet h100:2,h100:2 --fleet-models llama-v1,llama-v2  # a model per group
//	vllm-sim --lora-modules sql=/l/sql,chat=/l/chat --preload-loras sql
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-gw/sluice/testbed/simulator"
	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "vllm-sim:", err)
		os.Exit(2)
	}
}

// serverSpec is one simulated server to start.
type serverSpec struct {
	port    int
	profile string
	opts    simulator.Options
}

// flags holds the parsed command line.
type flags struct {
	fs               *flag.FlagSet
	model            string
	host             string
	port             int
	replicas         int
	ports            string
	fleet            string
	fleetModels      string
	basePort         int
	profile          string
	seed             uint64
	loraModules      string
	preloadLoRAs     string
	defaultMaxTokens int
	outputLength     string
	shutdownTimeout  time.Duration
	overrides        engine.Config
	noPrefixCaching  bool
	faults           simulator.Faults
}

func newFlags(out io.Writer) *flags {
	f := &flags{fs: flag.NewFlagSet("vllm-sim", flag.ContinueOnError)}
	fs := f.fs
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, "Usage: vllm-sim [flags]\n\n"+
			"Runs simulated vLLM servers (OpenAI API, vLLM /metrics, LoRA endpoints, POST /admin/faults).\n"+
			"Engine flags left unset take the hardware profile's value:\n\n")
		for _, name := range engine.ProfileNames() {
			c, _ := engine.Profile(name)
			fmt.Fprintf(out, "  %-5s max-num-seqs=%d max-num-batched-tokens=%d num-gpu-blocks=%d block-size=%d max-model-len=%d\n"+
				"        max-loras=%d lora-load-time=%v step-base=%v decode-per-seq=%v prefill-per-token=%v\n",
				name, c.MaxNumSeqs, c.MaxNumBatchedTokens, c.NumGPUBlocks, c.BlockSize, c.MaxModelLen,
				c.MaxLoRAs, c.LoRALoadTime, c.StepBase, c.DecodePerSeq, c.PrefillPerToken)
		}
		fmt.Fprint(out, "\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&f.model, "model", "meta-llama/Llama-3.1-8B-Instruct", "served base model name")
	fs.StringVar(&f.host, "host", "", "address to bind (empty: all interfaces)")
	fs.IntVar(&f.port, "port", 8000, "port of the first server")
	fs.IntVar(&f.replicas, "replicas", 1, "number of servers of --profile on consecutive ports from --port")
	fs.StringVar(&f.ports, "ports", "", "explicit ports, e.g. 8001-8004 or 8001,8003 (instead of --port/--replicas)")
	fs.StringVar(&f.fleet, "fleet", "", "mixed fleet as profile:count,..., e.g. h100:2,a10g:2, on consecutive ports from --base-port")
	fs.StringVar(&f.fleetModels, "fleet-models", "", "served base model of each --fleet entry, in order, e.g. llama-v1,llama-v2 (default: --model for all)")
	fs.IntVar(&f.basePort, "base-port", 0, "first port of --fleet (default: --port)")
	fs.StringVar(&f.profile, "profile", "h100", "hardware profile of --port/--ports servers")
	fs.Uint64Var(&f.seed, "seed", 0, "random seed; server i uses seed+i")
	fs.StringVar(&f.loraModules, "lora-modules", "", "LoRA adapters to register, name=path,...")
	fs.StringVar(&f.preloadLoRAs, "preload-loras", "", "registered adapters made GPU-resident at start, name,...")
	fs.IntVar(&f.defaultMaxTokens, "default-max-tokens", 128, "requests without max_tokens generate uniform [1, N] tokens")
	fs.StringVar(&f.outputLength, "output-length", "exact", "answers to requests with max_tokens: exact (max_tokens long) or ceiling (uniform in [1, max_tokens])")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM, time for in-flight requests to finish")

	o := &f.overrides
	fs.IntVar(&o.MaxNumSeqs, "max-num-seqs", 0, "override: running slots")
	fs.IntVar(&o.MaxNumBatchedTokens, "max-num-batched-tokens", 0, "override: token budget per step (prefill chunking)")
	fs.IntVar(&o.NumGPUBlocks, "num-gpu-blocks", 0, "override: KV cache size in blocks")
	fs.IntVar(&o.BlockSize, "block-size", 0, "override: tokens per KV block")
	fs.IntVar(&o.MaxModelLen, "max-model-len", 0, "override: max prompt+output tokens")
	fs.IntVar(&o.MaxLoRAs, "max-loras", 0, "override: GPU LoRA slots")
	fs.DurationVar(&o.LoRALoadTime, "lora-load-time", 0, "override: time to load a non-resident adapter (paid by its step)")
	fs.DurationVar(&o.StepBase, "step-base", 0, "override: fixed time per engine step")
	fs.DurationVar(&o.DecodePerSeq, "decode-per-seq", 0, "override: step time per decoding sequence")
	fs.DurationVar(&o.PrefillPerToken, "prefill-per-token", 0, "override: step time per uncached prompt token")
	fs.BoolVar(&f.noPrefixCaching, "no-enable-prefix-caching", false, "disable automatic prefix caching")

	fl := &f.faults
	fs.BoolVar(&fl.Crash, "fault-crash", false, "start crashed: connections are closed unanswered (clear via POST /admin/faults)")
	fs.BoolVar(&fl.Hang, "fault-hang", false, "start hung: requests are accepted and never answered")
	fs.Float64Var(&fl.ErrorRate, "fault-error-rate", 0, "probability of answering an inference request with a 500")
	fs.Float64Var(&fl.DropStreamRate, "fault-drop-stream-rate", 0, "probability of cutting a stream after half its tokens")
	fs.DurationVar(&fl.MetricsDelay, "fault-metrics-delay", 0, "delay of every /metrics answer")
	fs.Float64Var(&fl.Slowdown, "fault-slowdown", 0, "every engine step takes this many times its modelled duration (10: ten times slower)")
	return f
}

// plan parses args into the servers to start.
func plan(args []string, out io.Writer) ([]serverSpec, *flags, error) {
	f := newFlags(out)
	if err := f.fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if f.fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("unexpected arguments %q", f.fs.Args())
	}
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })

	type slot struct {
		port    int
		profile string
		model   string
	}
	var slots []slot
	switch {
	case f.fleet != "" && (set["ports"] || set["replicas"] || set["profile"]):
		return nil, nil, errors.New("--fleet excludes --ports, --replicas and --profile")
	case f.fleet == "" && set["fleet-models"]:
		return nil, nil, errors.New("--fleet-models needs --fleet")
	case set["ports"] && set["replicas"]:
		return nil, nil, errors.New("--ports excludes --replicas")
	case f.fleet != "":
		entries, err := engine.ParseFleet(f.fleet)
		if err != nil {
			return nil, nil, fmt.Errorf("--fleet: %w", err)
		}
		models := make([]string, len(entries))
		if set["fleet-models"] {
			models = strings.Split(f.fleetModels, ",")
			if len(models) != len(entries) {
				return nil, nil, fmt.Errorf("--fleet-models names %d models for %d --fleet entries", len(models), len(entries))
			}
		}
		port := f.port
		if set["base-port"] {
			port = f.basePort
		}
		for i, e := range entries {
			model := cmp.Or(strings.TrimSpace(models[i]), f.model)
			for range e.Count {
				slots = append(slots, slot{port, e.Profile, model})
				port++
			}
		}
	case set["ports"]:
		ports, err := parsePorts(f.ports)
		if err != nil {
			return nil, nil, err
		}
		for _, p := range ports {
			slots = append(slots, slot{p, f.profile, f.model})
		}
	default:
		if f.replicas < 1 {
			return nil, nil, fmt.Errorf("--replicas must be at least 1, got %d", f.replicas)
		}
		for i := range f.replicas {
			slots = append(slots, slot{f.port + i, f.profile, f.model})
		}
	}
	seen := map[int]bool{}
	for _, s := range slots {
		if s.port < 1 || s.port > 65535 {
			return nil, nil, fmt.Errorf("port %d out of range", s.port)
		}
		if seen[s.port] {
			return nil, nil, fmt.Errorf("port %d used twice", s.port)
		}
		seen[s.port] = true
	}

	loras, err := parseLoRAModules(f.loraModules)
	if err != nil {
		return nil, nil, err
	}
	var preload []string
	if f.preloadLoRAs != "" {
		preload = strings.Split(f.preloadLoRAs, ",")
	}
	specs := make([]serverSpec, 0, len(slots))
	for i, s := range slots {
		cfg, err := engine.Profile(s.profile)
		if err != nil {
			return nil, nil, err
		}
		applyOverrides(&cfg, &f.overrides, set)
		cfg.DisablePrefixCaching = f.noPrefixCaching
		specs = append(specs, serverSpec{port: s.port, profile: s.profile, opts: simulator.Options{
			Model: s.model, Engine: cfg, Seed: f.seed + uint64(i), LoRAModules: loras, PreloadLoRAs: preload,
			DefaultMaxTokens: f.defaultMaxTokens, OutputLength: simulator.OutputLength(f.outputLength), Faults: f.faults,
		}})
	}
	return specs, f, nil
}

// applyOverrides copies the engine flags the user set onto a profile.
func applyOverrides(cfg, o *engine.Config, set map[string]bool) {
	ints := map[string]struct{ dst, src *int }{
		"max-num-seqs":           {&cfg.MaxNumSeqs, &o.MaxNumSeqs},
		"max-num-batched-tokens": {&cfg.MaxNumBatchedTokens, &o.MaxNumBatchedTokens},
		"num-gpu-blocks":         {&cfg.NumGPUBlocks, &o.NumGPUBlocks},
		"block-size":             {&cfg.BlockSize, &o.BlockSize},
		"max-model-len":          {&cfg.MaxModelLen, &o.MaxModelLen},
		"max-loras":              {&cfg.MaxLoRAs, &o.MaxLoRAs},
	}
	for name, p := range ints {
		if set[name] {
			*p.dst = *p.src
		}
	}
	durations := map[string]struct{ dst, src *time.Duration }{
		"lora-load-time":    {&cfg.LoRALoadTime, &o.LoRALoadTime},
		"step-base":         {&cfg.StepBase, &o.StepBase},
		"decode-per-seq":    {&cfg.DecodePerSeq, &o.DecodePerSeq},
		"prefill-per-token": {&cfg.PrefillPerToken, &o.PrefillPerToken},
	}
	for name, p := range durations {
		if set[name] {
			*p.dst = *p.src
		}
	}
}

// parsePorts parses "8001-8004", "8001,8003" or a mix.
func parsePorts(spec string) ([]int, error) {
	var out []int
	for part := range strings.SplitSeq(spec, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("--ports entry %q: %w", part, err)
		}
		last := first
		if isRange {
			if last, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("--ports entry %q: %w", part, err)
			}
			if last < first {
				return nil, fmt.Errorf("--ports entry %q: empty range", part)
			}
		}
		for p := first; p <= last; p++ {
			out = append(out, p)
		}
	}
	return out, nil
}

// parseLoRAModules parses "name=path,..." (vLLM --lora-modules).
func parseLoRAModules(spec string) ([]simulator.LoRAModule, error) {
	if spec == "" {
		return nil, nil
	}
	var out []simulator.LoRAModule
	for part := range strings.SplitSeq(spec, ",") {
		name, path, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || name == "" || path == "" {
			return nil, fmt.Errorf("--lora-modules entry %q: want name=path", part)
		}
		out = append(out, simulator.LoRAModule{Name: name, Path: path})
	}
	return out, nil
}

// run starts every planned server and serves until ctx is done, then drains
// them for up to --shutdown-timeout.
func run(ctx context.Context, args []string, out io.Writer) error {
	specs, f, err := plan(args, out)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(out, nil))
	type running struct {
		sim  *simulator.Server
		http *http.Server
		ln   net.Listener
	}
	var servers []running
	defer func() {
		for _, r := range servers {
			r.sim.Close()
			_ = r.http.Close()
		}
	}()
	for _, spec := range specs {
		spec.opts.Registry = prometheus.NewRegistry()
		sim, err := simulator.New(spec.opts)
		if err != nil {
			return fmt.Errorf("server on port %d: %w", spec.port, err)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(f.host, strconv.Itoa(spec.port)))
		if err != nil {
			sim.Close()
			return err
		}
		hs := &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, running{sim, hs, ln})
		log.Info("simulated vLLM server", "addr", ln.Addr().String(), "profile", spec.profile, "model", spec.opts.Model,
			"max_num_seqs", spec.opts.Engine.MaxNumSeqs, "num_gpu_blocks", spec.opts.Engine.NumGPUBlocks,
			"max_loras", spec.opts.Engine.MaxLoRAs, "seed", spec.opts.Seed)
	}
	errs := make(chan error, len(servers))
	for _, r := range servers {
		go func() {
			if err := r.http.Serve(r.ln); !errors.Is(err, http.ErrServerClosed) {
				errs <- err
			}
		}()
	}
	select {
	case <-ctx.Done():
	case err := <-errs:
		return err
	}
	log.Info("shutting down", "timeout", f.shutdownTimeout)
	// Engines keep running while in-flight requests finish; the deferred
	// Close then answers whatever is left after the timeout.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), f.shutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, r := range servers {
		wg.Go(func() { _ = r.http.Shutdown(shutdownCtx) })
	}
	wg.Wait()
	return nil
}
