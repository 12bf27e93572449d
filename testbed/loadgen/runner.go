package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Mode is the load model.
type Mode string

const (
	// ModeOpen sends requests at arrival times regardless of completions.
	ModeOpen Mode = "open"
	// ModeClosed runs Users concurrent users, each sending its next request
	// when the previous one finished.
	ModeClosed Mode = "closed"
)

// servedHeader is where the Sluice data plane reports the endpoint that
// answered (GIE's x-gateway-destination-endpoint-served key).
const servedHeader = "x-gateway-destination-endpoint-served"

// Defaults for RunConfig.
const (
	DefaultRequestTimeout = 10 * time.Minute
	DefaultMaxInFlight    = 10000
	DefaultMaxRetryWait   = time.Minute
)

// RetryPolicy makes the runner behave like an SDK that honours Retry-After:
// a 429 or 503 that carries Retry-After is retried after that delay
// (capped at MaxWait) until MaxAttempts attempts were made. Answers without
// Retry-After are not retried.
type RetryPolicy struct {
	// MaxAttempts counts the first attempt; 0 or 1 disables retries.
	MaxAttempts int `json:"max_attempts"`
	// MaxWait caps one wait. Zero means DefaultMaxRetryWait.
	MaxWait time.Duration `json:"max_wait_ns"`
}

// RunConfig configures Run.
type RunConfig struct {
	// Target is the base URL (scheme://host:port) of the gateway. Its host
	// must be a loopback address.
	Target string `json:"target"`
	// Targets, when set (Target then empty), are several gateways the
	// requests are interleaved over, one load for all: each run of
	// len(Targets) consecutive requests goes through every target once, in
	// an order drawn from Seed, and a retry goes where its first attempt
	// went. Record.Target says which. Load swings on the machine then hit
	// every target alike, which one target after another does not.
	Targets []string `json:"targets,omitempty"`
	Mix     *Mix     `json:"mix"`
	Seed    uint64   `json:"seed"`
	Mode    Mode     `json:"mode"`
	// Arrival drives open-loop mode.
	Arrival ArrivalConfig `json:"arrival"`
	// Users is the number of closed-loop users.
	Users int `json:"users,omitempty"`
	// Duration stops issuing new requests after this long; MaxRequests
	// after that many requests. At least one must be set.
	Duration    time.Duration `json:"duration_ns,omitempty"`
	MaxRequests int           `json:"max_requests,omitempty"`
	// RequestTimeout bounds one attempt. Zero means DefaultRequestTimeout.
	RequestTimeout time.Duration `json:"request_timeout_ns"`
	// Drain bounds how long requests still running when issuing stops may
	// take; the rest are cancelled and recorded as errors. Zero means
	// RequestTimeout.
	Drain time.Duration `json:"drain_ns"`
	// MaxInFlight caps concurrent open-loop requests; an arrival beyond it is
	// recorded as a client-side drop instead of delaying the schedule. Zero
	// means DefaultMaxInFlight.
	MaxInFlight int         `json:"max_in_flight"`
	Retry       RetryPolicy `json:"retry"`
	// SLO applies to classes that set none.
	SLO SLO `json:"slo"`
	// Client sends the requests; nil means a client that only dials
	// loopback addresses and never follows redirects.
	Client *http.Client `json:"-"`
	// OnRecord, if set, is called for every attempt as it completes, from
	// many goroutines at once (for progress display).
	OnRecord func(Record) `json:"-"`

	// wait is the seam for retry delays and the arrival schedule; nil means
	// real timers.
	wait func(ctx context.Context, d time.Duration) error
}

// Result is the outcome of a run: every attempt plus the summary.
type Result struct {
	Config  RunConfig `json:"config"`
	Started time.Time `json:"started"`
	Summary Summary   `json:"summary"`
	Records []Record  `json:"records"`
}

func (c *RunConfig) applyDefaults() {
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.Drain == 0 {
		c.Drain = c.RequestTimeout
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.Retry.MaxWait == 0 {
		c.Retry.MaxWait = DefaultMaxRetryWait
	}
	if c.Client == nil {
		c.Client = NewLoopbackClient()
	}
	if c.wait == nil {
		c.wait = Sleep
	}
}

// Validate checks a config, reporting every problem at once.
func (c *RunConfig) Validate() error {
	var errs []error
	switch {
	case len(c.Targets) == 0:
		if err := CheckLoopbackURL(c.Target); err != nil {
			errs = append(errs, err)
		}
	case c.Target != "":
		errs = append(errs, errors.New("set a target or targets, not both"))
	default:
		for _, t := range c.Targets {
			if err := CheckLoopbackURL(t); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(append(errs, c.ValidateLoad())...)
}

// ValidateLoad checks everything but the target: the mix, the load model, when the run ends, and that no duration or
// count is negative. Engines that send the same load elsewhere (the virtual-time engine) validate it with this.
func (c *RunConfig) ValidateLoad() error {
	var errs []error
	if c.Mix == nil {
		errs = append(errs, errors.New("a mix is required"))
	} else if err := c.Mix.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch c.Mode {
	case ModeOpen:
		if err := c.Arrival.Validate(); err != nil {
			errs = append(errs, err)
		}
	case ModeClosed:
		if c.Users < 1 {
			errs = append(errs, fmt.Errorf("closed loop needs at least one user, got %d", c.Users))
		}
	default:
		errs = append(errs, fmt.Errorf("mode %q is not open or closed", c.Mode))
	}
	if c.Duration <= 0 && c.MaxRequests <= 0 {
		errs = append(errs, errors.New("set a duration or a request count: a run must end by itself"))
	}
	if c.Duration < 0 || c.MaxRequests < 0 || c.RequestTimeout < 0 || c.Drain < 0 || c.MaxInFlight < 0 || c.Retry.MaxAttempts < 0 || c.Retry.MaxWait < 0 {
		errs = append(errs, errors.New("durations and counts must not be negative"))
	}
	return errors.Join(errs...)
}

// CheckLoopbackURL accepts only http(s) URLs whose host is a loopback IP or
// "localhost": the load generator never sends traffic off the machine.
func CheckLoopbackURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("target %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("target %q: scheme must be http or https", raw)
	}
	if !isLoopbackHost(u.Hostname()) {
		return fmt.Errorf("target %q: host must be a loopback address (127.0.0.0/8, ::1 or localhost)", raw)
	}
	return nil
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// NewLoopbackClient returns an HTTP client whose dialer refuses any
// non-loopback address (after name resolution) and that does not follow
// redirects.
func NewLoopbackClient() *http.Client {
	dialer := &net.Dialer{
		Timeout: 10 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
				return fmt.Errorf("refusing to connect to non-loopback address %s", address)
			}
			return nil
		},
	}
	return &http.Client{
		Transport: &http.Transport{
			DialContext:         dialer.DialContext,
			MaxIdleConns:        4096,
			MaxIdleConnsPerHost: 4096,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Sleep waits d or until ctx ends, whichever comes first, and returns ctx's error in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runner holds the state of one Run.
type runner struct {
	cfg   RunConfig
	start time.Time
	slos  map[string]SLO

	genMu sync.Mutex
	gen   *Generator
	turns *turns // nil with one target

	recMu   sync.Mutex
	records []Record
}

// Run executes a load run and returns every attempt and the summary. It
// ends by itself: issuing stops at Duration or MaxRequests, requests still
// running get Drain to finish, and ctx cancels everything early. The
// returned error reports an invalid config; request failures are records.
func Run(ctx context.Context, cfg RunConfig) (*Result, error) {
	ownClient := cfg.Client == nil
	cfg.applyDefaults()
	if ownClient {
		// Idle keep-alive connections would otherwise outlive the run.
		defer cfg.Client.CloseIdleConnections()
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid run config: %w", err)
	}
	r := &runner{cfg: cfg, gen: NewGenerator(cfg.Mix, cfg.Seed), slos: map[string]SLO{}}
	if len(cfg.Targets) > 0 {
		r.turns = newTurns(len(cfg.Targets), cfg.Seed)
	}
	for _, c := range cfg.Mix.Classes {
		r.slos[c.Name] = c.SLO.orElse(cfg.SLO)
	}

	// Requests run under reqCtx, which outlives the issuing window by Drain.
	reqCtx, cancelRequests := context.WithCancel(ctx)
	defer cancelRequests()
	issueCtx := ctx
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		issueCtx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}

	r.start = time.Now()
	var wg sync.WaitGroup
	switch cfg.Mode {
	case ModeOpen:
		r.runOpen(issueCtx, reqCtx, &wg)
	case ModeClosed:
		r.runClosed(issueCtx, reqCtx, &wg)
	}
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	drainTimer := time.NewTimer(cfg.Drain)
	select {
	case <-drained:
	case <-drainTimer.C:
		cancelRequests()
		<-drained
	}
	drainTimer.Stop()
	elapsed := time.Since(r.start)

	res := &Result{Config: cfg, Started: r.start, Records: r.records}
	res.Summary = Summarize(r.records, SummaryOptions{Duration: elapsed, SLOs: r.slos, DefaultSLO: cfg.SLO})
	return res, nil
}

// next returns the next request and the index of the target it goes to.
func (r *runner) next() (RequestSpec, int) {
	r.genMu.Lock()
	defer r.genMu.Unlock()
	target := 0
	if r.turns != nil {
		target = r.turns.next()
	}
	return r.gen.Next(), target
}

// targetURL is the base URL of target index i.
func (r *runner) targetURL(i int) string {
	if len(r.cfg.Targets) > 0 {
		return r.cfg.Targets[i]
	}
	return r.cfg.Target
}

// turns hands out target indices in rounds: each round is a permutation
// of all n, drawn from the seed, so every target gets every n-th request
// on average and no target always follows another.
type turns struct {
	rng   *rand.Rand
	round []int
	pos   int
}

func newTurns(n int, seed uint64) *turns {
	t := &turns{rng: rand.New(rand.NewPCG(seed, 0x7475726e73)), round: make([]int, n)}
	for i := range t.round {
		t.round[i] = i
	}
	t.pos = n
	return t
}

func (t *turns) next() int {
	if t.pos == len(t.round) {
		t.rng.Shuffle(len(t.round), func(i, j int) { t.round[i], t.round[j] = t.round[j], t.round[i] })
		t.pos = 0
	}
	t.pos++
	return t.round[t.pos-1]
}

func (r *runner) runOpen(issueCtx, reqCtx context.Context, wg *sync.WaitGroup) {
	arrivals, err := NewArrivals(r.cfg.Arrival, r.cfg.Seed)
	if err != nil {
		return // validated before
	}
	var inFlight atomic.Int64
	for n := 0; r.cfg.MaxRequests == 0 || n < r.cfg.MaxRequests; n++ {
		at := arrivals.Next()
		if r.cfg.Duration > 0 && at >= r.cfg.Duration {
			return
		}
		if r.cfg.wait(issueCtx, at-time.Since(r.start)) != nil {
			return
		}
		spec, target := r.next()
		if inFlight.Load() >= int64(r.cfg.MaxInFlight) {
			rec := recordFor(spec, at, time.Since(r.start), 1)
			rec.Target = target
			r.add(rec, true, "dropped by the load generator: max in-flight requests reached")
			continue
		}
		inFlight.Add(1)
		wg.Go(func() {
			defer inFlight.Add(-1)
			r.do(reqCtx, spec, target, at)
		})
	}
}

func (r *runner) runClosed(issueCtx, reqCtx context.Context, wg *sync.WaitGroup) {
	var issued atomic.Int64
	for range r.cfg.Users {
		wg.Go(func() {
			for issueCtx.Err() == nil {
				if r.cfg.MaxRequests > 0 && issued.Add(1) > int64(r.cfg.MaxRequests) {
					return
				}
				spec, target := r.next()
				r.do(reqCtx, spec, target, time.Since(r.start))
			}
		})
	}
}

func recordFor(spec RequestSpec, scheduled, start time.Duration, attempt int) Record {
	return Record{
		Seq: spec.Seq, Attempt: attempt, Class: spec.Class, Model: spec.Model, Stream: spec.Stream,
		PrefixGroup: spec.PrefixGroup, ChatID: spec.ChatID, Turn: spec.Turn,
		PromptTokens: spec.PromptTokens, MaxTokens: spec.MaxTokens,
		Scheduled: scheduled, Start: start,
	}
}

// add stores a record (marking it final or not) and reports it.
func (r *runner) add(rec Record, final bool, errMsg string) {
	rec.Final = final
	if errMsg != "" {
		rec.Error = errMsg
	}
	r.recMu.Lock()
	r.records = append(r.records, rec)
	r.recMu.Unlock()
	if r.cfg.OnRecord != nil {
		r.cfg.OnRecord(rec)
	}
}

// do runs one request, retrying after Retry-After as the policy allows.
func (r *runner) do(ctx context.Context, spec RequestSpec, target int, scheduled time.Duration) {
	var first time.Duration
	for attempt := 1; ; attempt++ {
		start := time.Since(r.start)
		if attempt == 1 {
			first = start
		}
		rec := recordFor(spec, scheduled, start, attempt)
		rec.SinceFirstAttempt = start - first
		rec.Target = target
		r.attempt(ctx, spec, &rec)
		retry := attempt < r.cfg.Retry.MaxAttempts && rec.RetryAfterSet &&
			(rec.Status == http.StatusTooManyRequests || rec.Status == http.StatusServiceUnavailable) && ctx.Err() == nil
		if retry && r.cfg.wait(ctx, min(rec.RetryAfter, r.cfg.Retry.MaxWait)) != nil {
			retry = false // cancelled while waiting: this attempt is the last
		}
		r.add(rec, !retry, "")
		if !retry {
			return
		}
	}
}

// attempt sends one HTTP request and measures it into rec.
func (r *runner) attempt(ctx context.Context, spec RequestSpec, rec *Record) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(r.targetURL(rec.Target), "/")+spec.API.Path(), bytes.NewReader(spec.Body))
	if err != nil {
		rec.Error = err.Error()
		return
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range spec.Headers {
		req.Header.Set(k, v)
	}
	if spec.Stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	sent := time.Now()
	resp, err := r.cfg.Client.Do(req)
	if err != nil {
		rec.E2E = time.Since(sent)
		rec.Error = err.Error()
		return
	}
	defer func() { _ = resp.Body.Close() }()
	rec.Status = resp.StatusCode
	rec.Endpoint = resp.Header.Get(servedHeader)
	rec.parseServerTimes(resp.Header)
	rec.parseEPPTime(resp.Header)
	rec.parseRequestID(resp.Header)
	if d, ok := ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		rec.RetryAfter, rec.RetryAfterSet = d, true
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		excerpt, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		rec.E2E = time.Since(sent)
		rec.Error = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(excerpt)))
		return
	}
	if spec.Stream && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		readStream(resp.Body, sent, rec)
	} else {
		readWhole(resp.Body, sent, rec)
	}
}

// completionChunk is the subset of chat and completions responses (and
// their stream chunks) the load generator reads.
type completionChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// readStream reads an SSE stream: TTFT at the first chunk with content,
// ITL between content chunks, success only if "data: [DONE]" arrives.
func readStream(body io.Reader, sent time.Time, rec *Record) {
	br := bufio.NewReaderSize(body, 64<<10)
	var last time.Time
	chunks, done := 0, false
	usage := -1
	for !done {
		line, err := br.ReadString('\n')
		if data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data:"); ok {
			data = strings.TrimSpace(data)
			if data == "[DONE]" {
				done = true
				break
			}
			now := time.Now()
			var c completionChunk
			if jerr := json.Unmarshal([]byte(data), &c); jerr != nil {
				rec.Error = "malformed stream chunk: " + jerr.Error()
				break
			}
			if len(c.Error) > 0 && string(c.Error) != "null" {
				rec.Error = "error in stream: " + string(c.Error)
				break
			}
			if c.Usage != nil {
				usage = c.Usage.CompletionTokens
			}
			if len(c.Choices) > 0 && (c.Choices[0].Delta.Content != "" || c.Choices[0].Text != "") {
				if chunks == 0 {
					rec.TTFT = now.Sub(sent)
				} else {
					rec.ITL = append(rec.ITL, now.Sub(last))
				}
				last = now
				chunks++
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				rec.Error = "stream broken: " + err.Error()
			}
			break
		}
	}
	rec.E2E = time.Since(sent)
	if !done && rec.Error == "" {
		rec.Error = "stream ended without [DONE]"
	}
	rec.OutputTokens = chunks
	if usage >= 0 {
		rec.OutputTokens = usage
	}
}

// readWhole reads a non-streaming response; its TTFT is its E2E since no
// token is visible before the body is complete.
func readWhole(body io.Reader, sent time.Time, rec *Record) {
	b, err := io.ReadAll(body)
	rec.E2E = time.Since(sent)
	rec.TTFT = rec.E2E
	if err != nil {
		rec.Error = "reading body: " + err.Error()
		return
	}
	var c completionChunk
	if err := json.Unmarshal(b, &c); err != nil {
		rec.Error = "malformed response body: " + err.Error()
		return
	}
	if c.Usage != nil {
		rec.OutputTokens = c.Usage.CompletionTokens
	} else if len(c.Choices) > 0 {
		rec.OutputTokens = EstimateTokens(c.Choices[0].Text + c.Choices[0].Message.Content)
	}
}
