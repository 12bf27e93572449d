// Command loadgen sends OpenAI-style LLM traffic to a gateway on this machine
// and reports TTFT, ITL, end-to-end latency, throughput and goodput per
// request class (see package loadgen for the mix file format).
//
// Usage:
//
//	loadgen --target http://127.0.0.1:8081 --mix mix.yaml --mode open --rate 20 --duration 60s --out results.json
//	loadgen --target http://127.0.0.1:8081 --model llama --mode closed --users 16 --requests 500
//	loadgen compare sluice=sluice.json round-robin=rr.json
//
// compare prints, side by side, what each gateway did with the same load,
// from the --out files of earlier runs.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "compare" {
		return compare(args[1:], stdout)
	}
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		target      = fs.String("target", "", "gateway base URL; must be a loopback address, e.g. http://127.0.0.1:8081 (required)")
		mixFile     = fs.String("mix", "", "mix file (YAML or JSON); without it one class is built from --model/--prompt-tokens/--output-tokens")
		model       = fs.String("model", "", "model of the built-in class (without --mix)")
		promptTok   = fs.Int("prompt-tokens", 256, "prompt length of the built-in class (4 characters per token)")
		outputTok   = fs.Int("output-tokens", 64, "max_tokens of the built-in class")
		api         = fs.String("api", "chat", "API of the built-in class: chat or completions")
		noStream    = fs.Bool("no-stream", false, "built-in class: non-streaming requests")
		mode        = fs.String("mode", "open", "open (arrival process) or closed (N users)")
		arrival     = fs.String("arrival", "poisson", "open-loop arrivals: poisson, constant or bursty")
		rate        = fs.Float64("rate", 1, "open-loop requests per second (during ON windows when bursty)")
		burstOn     = fs.Duration("burst-on", 0, "bursty: length of ON windows")
		burstOff    = fs.Duration("burst-off", 0, "bursty: length of OFF windows")
		users       = fs.Int("users", 0, "closed-loop concurrent users")
		duration    = fs.Duration("duration", 0, "stop issuing requests after this long")
		requests    = fs.Int("requests", 0, "stop after this many requests")
		seed        = fs.Uint64("seed", 1, "seed of the request sequence and arrival times")
		timeout     = fs.Duration("timeout", loadgen.DefaultRequestTimeout, "timeout of one attempt")
		drain       = fs.Duration("drain", 0, "how long running requests may finish after issuing stops (default: --timeout)")
		maxInFlight = fs.Int("max-inflight", loadgen.DefaultMaxInFlight, "open loop: cap on concurrent requests; arrivals beyond it are recorded as dropped")
		maxAttempts = fs.Int("max-attempts", 1, "attempts per request when the answer is 429/503 with Retry-After (1 = never retry)")
		maxWait     = fs.Duration("max-retry-wait", loadgen.DefaultMaxRetryWait, "cap on one Retry-After wait")
		sloTTFT     = fs.Duration("slo-ttft", 0, "goodput: TTFT bound for classes without their own")
		sloITL      = fs.Duration("slo-itl", 0, "goodput: mean ITL bound for classes without their own")
		sloE2E      = fs.Duration("slo-e2e", 0, "goodput: end-to-end bound for classes without their own")
		out         = fs.String("out", "", "write JSON results (config, summary, every attempt) to this file")
		progress    = fs.Bool("progress", false, "show a progress bar on stderr even when it is not a terminal")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	if *target == "" {
		return errors.New("--target is required")
	}

	mix, err := loadMix(*mixFile, *model, *promptTok, *outputTok, *api, !*noStream)
	if err != nil {
		return err
	}
	cfg := loadgen.RunConfig{
		Target:         *target,
		Mix:            mix,
		Seed:           *seed,
		Mode:           loadgen.Mode(*mode),
		Arrival:        loadgen.ArrivalConfig{Kind: loadgen.ArrivalKind(*arrival), Rate: *rate, BurstOn: *burstOn, BurstOff: *burstOff},
		Users:          *users,
		Duration:       *duration,
		MaxRequests:    *requests,
		RequestTimeout: *timeout,
		Drain:          *drain,
		MaxInFlight:    *maxInFlight,
		Retry:          loadgen.RetryPolicy{MaxAttempts: *maxAttempts, MaxWait: *maxWait},
		SLO:            loadgen.SLO{TTFT: loadgen.Duration(*sloTTFT), ITL: loadgen.Duration(*sloITL), E2E: loadgen.Duration(*sloE2E)},
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var bar *progressBar
	if *progress || isTerminal(stderr) {
		bar = newProgressBar(stderr, *requests, *duration)
		cfg.OnRecord = bar.record
		bar.start()
	}
	res, err := loadgen.Run(ctx, cfg)
	if bar != nil {
		bar.stop()
	}
	if err != nil {
		return err
	}
	if err := loadgen.WriteReport(stdout, res.Summary); err != nil {
		return err
	}
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		if err := loadgen.WriteJSON(f, res); err != nil {
			_ = f.Close()
			return fmt.Errorf("writing %s: %w", *out, err)
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

// compare reads NAME=FILE results and prints them side by side.
func compare(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("compare: give NAME=FILE arguments, FILE a --out file")
	}
	contenders := make([]loadgen.Contender, 0, len(args))
	for _, arg := range args {
		name, file, ok := strings.Cut(arg, "=")
		if !ok || name == "" || file == "" {
			return fmt.Errorf("compare: %q is not NAME=FILE", arg)
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("compare: %w", err)
		}
		var res loadgen.Result
		if err := json.Unmarshal(data, &res); err != nil {
			return fmt.Errorf("compare: %s: %w", file, err)
		}
		contenders = append(contenders, loadgen.Contender{Name: name, Summary: res.Summary})
	}
	return loadgen.WriteComparison(stdout, contenders)
}

// loadMix reads the mix file, or builds a one-class mix from flags.
func loadMix(file, model string, prompt, output int, api string, stream bool) (*loadgen.Mix, error) {
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		m, err := loadgen.ParseMix(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		return m, nil
	}
	if model == "" {
		return nil, errors.New("give --mix or --model")
	}
	y := fmt.Sprintf("api: %q\nstream: %v\nclasses: [{name: default, model: %q, prompt_tokens: %d, output_tokens: %d}]\n",
		api, stream, model, prompt, output)
	m, err := loadgen.ParseMix([]byte(y))
	if err != nil {
		return nil, fmt.Errorf("built-in class: %w", err)
	}
	return m, nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progressBar redraws one status line on stderr twice a second.
type progressBar struct {
	w        io.Writer
	total    int
	duration time.Duration
	begin    time.Time
	done     atomic.Int64
	failed   atomic.Int64
	quit     chan struct{}
	wg       sync.WaitGroup
}

func newProgressBar(w io.Writer, total int, duration time.Duration) *progressBar {
	return &progressBar{w: w, total: total, duration: duration, quit: make(chan struct{})}
}

func (p *progressBar) record(r loadgen.Record) {
	if !r.Final {
		return
	}
	p.done.Add(1)
	if !r.OK() {
		p.failed.Add(1)
	}
}

func (p *progressBar) start() {
	p.begin = time.Now()
	p.wg.Go(func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.draw()
			case <-p.quit:
				p.draw()
				fmt.Fprintln(p.w)
				return
			}
		}
	})
}

func (p *progressBar) stop() {
	close(p.quit)
	p.wg.Wait()
}

func (p *progressBar) draw() {
	const width = 30
	elapsed := time.Since(p.begin)
	done := p.done.Load()
	frac := 0.0
	if p.total > 0 {
		frac = float64(done) / float64(p.total)
	}
	if p.duration > 0 {
		frac = max(frac, elapsed.Seconds()/p.duration.Seconds())
	}
	frac = min(frac, 1)
	filled := int(frac * width)
	fmt.Fprintf(p.w, "\r[%s%s] %3.0f%%  %d done  %d failed  %s ",
		strings.Repeat("#", filled), strings.Repeat(".", width-filled), 100*frac, done, p.failed.Load(), elapsed.Round(time.Second))
}
