package simulator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/utils/clock"

	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// Response headers with the server's own account of a request's start, so a benchmark can split a client's time to
// first token into the way to the server (routing, an EPP's queue, proxies), the wait inside the server for a place
// in the running batch, and the prefill. vLLM sends no such headers; clients ignore them. Values are seconds.
const (
	// QueueTimeHeader is the time from the request's arrival at the server to its first scheduling into the running
	// batch (vLLM's request_queue_time).
	QueueTimeHeader = "x-sim-queue-seconds"
	// FirstTokenTimeHeader is the time from the request's arrival at the server to its first token (vLLM's
	// time_to_first_token, as the server measures it).
	FirstTokenTimeHeader = "x-sim-first-token-seconds"
)

const (
	maxBodyBytes            = 16 << 20
	defaultDefaultMaxTokens = 128
	adminFaultsPath         = "/admin/faults"
)

// LoRAModule registers a LoRA adapter at startup (vLLM --lora-modules
// name=path).
type LoRAModule struct {
	Name, Path string
}

// Options configure one simulated server.
type Options struct {
	// Model is the served base model name; required.
	Model string
	// Engine sizes and times the server (see engine.Profile).
	Engine engine.Config
	// Clock drives the engine in real time; nil means clock.RealClock.
	Clock clock.Clock
	// Registry receives the server's metrics and is served on /metrics;
	// nil means a fresh registry. Give each server its own.
	Registry *prometheus.Registry
	// Seed makes output lengths, output text and fault decisions
	// reproducible.
	Seed uint64
	// LoRAModules are registered at startup.
	LoRAModules []LoRAModule
	// PreloadLoRAs are registered adapters made GPU-resident at startup (and
	// after a crash), so their first requests pay no load.
	PreloadLoRAs []string
	// DefaultMaxTokens bounds the output of requests without max_tokens:
	// their length is uniform in [1, DefaultMaxTokens] (finish_reason
	// "stop"). 0 means 128.
	DefaultMaxTokens int
	// OutputLength is how long an answer to a request that sets max_tokens is: exactly max_tokens ("" or
	// OutputExact) or uniform in [1, max_tokens] (OutputCeiling).
	OutputLength OutputLength
	// Faults are injected from the start.
	Faults Faults
}

func (o *Options) validate() error {
	var errs []error
	if o.Model == "" {
		errs = append(errs, errors.New("model name is required"))
	}
	if err := o.Engine.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.DefaultMaxTokens < 0 {
		errs = append(errs, fmt.Errorf("default max tokens must not be negative, got %d", o.DefaultMaxTokens))
	}
	if _, err := ParseOutputLength(string(o.OutputLength)); err != nil {
		errs = append(errs, err)
	}
	if err := o.Faults.Validate(); err != nil {
		errs = append(errs, err)
	}
	names := map[string]bool{}
	for _, m := range o.LoRAModules {
		switch {
		case m.Name == "":
			errs = append(errs, errors.New("LoRA module with empty name"))
		case m.Name == o.Model:
			errs = append(errs, fmt.Errorf("LoRA module %q has the base model's name", m.Name))
		case names[m.Name]:
			errs = append(errs, fmt.Errorf("LoRA module %q registered twice", m.Name))
		}
		names[m.Name] = true
	}
	if len(o.LoRAModules) > 0 && o.Engine.MaxLoRAs == 0 {
		errs = append(errs, errors.New("LoRA modules given but max-loras is 0"))
	}
	for _, p := range o.PreloadLoRAs {
		if !names[p] {
			errs = append(errs, fmt.Errorf("preloaded LoRA %q is not a registered LoRA module", p))
		}
	}
	if len(o.PreloadLoRAs) > o.Engine.MaxLoRAs {
		errs = append(errs, fmt.Errorf("%d LoRAs to preload but only %d slots", len(o.PreloadLoRAs), o.Engine.MaxLoRAs))
	}
	return errors.Join(errs...)
}

// Server is one simulated vLLM server: an http.Handler in front of an
// engine.Engine that one driver goroutine advances in real time. Handlers
// submit requests and wait on a per-request channel; no goroutine or timer
// exists per request or per token.
type Server struct {
	model            string
	cfg              engine.Config
	clock            clock.Clock
	seed             uint64
	defaultMaxTokens int
	outputLength     OutputLength
	preload          []string
	faults           *faultState
	recorder         requestRecorder
	metrics          http.Handler
	mux              *http.ServeMux

	kick       chan struct{} // wakes the driver: the engine has new work
	stop       chan struct{} // closed by Close
	driverDone chan struct{}
	closeOnce  sync.Once

	mu       sync.Mutex // guards everything below and the engine
	engine   *engine.Engine
	inflight map[uint64]*inflight
	adapters map[string]string // registered LoRA name -> path
	rng      *rand.Rand
	nextID   uint64
	crashed  bool
	closed   bool
}

// inflight is a request between submit and its answer. Fields below req are
// guarded by Server.mu.
type inflight struct {
	req       *engine.Request
	respID    string
	model     string // echoed in responses: the base model or the adapter
	created   int64
	reason    string // finish_reason when all tokens are out
	stream    bool
	dropAfter int           // cut the stream after this many tokens; 0 never
	notify    chan struct{} // capacity 1: "state changed"

	generated   int
	lastTokenAt time.Time
	done        bool
	aborted     bool // the engine was restarted by a crash fault
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// New validates opts, registers metrics and starts the server's driver.
// Call Close to stop it.
func New(opts Options) (*Server, error) {
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("invalid simulator options: %w", err)
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.DefaultMaxTokens == 0 {
		opts.DefaultMaxTokens = defaultDefaultMaxTokens
	}
	s := &Server{
		model:            opts.Model,
		cfg:              opts.Engine,
		clock:            opts.Clock,
		seed:             opts.Seed,
		defaultMaxTokens: opts.DefaultMaxTokens,
		outputLength:     opts.OutputLength,
		preload:          slices.Clone(opts.PreloadLoRAs),
		faults:           newFaultState(opts.Faults),
		kick:             make(chan struct{}, 1),
		stop:             make(chan struct{}),
		driverDone:       make(chan struct{}),
		inflight:         make(map[uint64]*inflight),
		adapters:         make(map[string]string),
		rng:              rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x5eed)),
		crashed:          opts.Faults.Crash,
	}
	for _, m := range opts.LoRAModules {
		s.adapters[m.Name] = m.Path
	}
	var err error
	if s.engine, err = s.newEngine(); err != nil {
		return nil, err
	}
	rec, err := registerMetrics(opts.Registry, s.model, s.cfg, s.snapshot)
	if err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	s.recorder = rec
	s.metrics = promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{})
	s.mux = s.routes()
	go s.drive()
	return s, nil
}

func (s *Server) newEngine() (*engine.Engine, error) {
	e, err := engine.NewEngine(s.cfg, engine.ObserverFunc(s.stepDone))
	if err != nil {
		return nil, err
	}
	f, _ := s.faults.get()
	e.SetSlowdown(f.Slowdown)
	for _, name := range s.preload {
		if err := e.PreloadAdapter(name); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// Close stops the driver. Requests still in flight are answered 503 (or
// their stream is cut); requests arriving later get 503. Stop the HTTP
// server first (http.Server.Shutdown) to let in-flight requests finish.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.stop)
		<-s.driverDone
	})
}

func (s *Server) wake() { signal(s.kick) }

// drive advances the engine to the clock: it sleeps until the engine's next
// event or until a handler submits or cancels work.
func (s *Server) drive() {
	defer close(s.driverDone)
	for {
		s.mu.Lock()
		now := s.clock.Now()
		s.engine.Advance(now)
		next, ok := s.engine.NextEvent()
		s.mu.Unlock()
		var timer clock.Timer
		var fire <-chan time.Time
		if ok {
			timer = s.clock.NewTimer(next.Sub(now))
			fire = timer.C()
		}
		select {
		case <-fire:
		case <-s.kick:
		case <-s.stop:
		}
		if timer != nil {
			timer.Stop()
		}
		select {
		case <-s.stop:
			return
		default:
		}
	}
}

// stepDone delivers a step's tokens to the waiting handlers and records
// latencies. It runs inside Advance, with s.mu held.
func (s *Server) stepDone(out *engine.StepOutput) {
	for _, r := range out.Emitted {
		h := s.inflight[r.ID]
		if h == nil {
			continue
		}
		if r.Generated() == 1 {
			s.recorder.token(true, out.End.Sub(r.Arrival()))
		} else {
			s.recorder.token(false, out.End.Sub(h.lastTokenAt))
		}
		h.lastTokenAt = out.End
		h.generated = r.Generated()
		if r.Done() {
			h.done = true
			s.recorder.finished(h.reason, out.End.Sub(r.Arrival()), r.ScheduledAt().Sub(r.Arrival()))
		}
		if h.stream || h.done {
			signal(h.notify)
		}
	}
}

// snapshot feeds the metrics collector.
func (s *Server) snapshot() (engine.Stats, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.engine.Stats(), s.clock.Now()
}

// Stats returns a snapshot of the engine.
func (s *Server) Stats() engine.Stats {
	st, _ := s.snapshot()
	return st
}

// Faults returns the faults in force.
func (s *Server) Faults() Faults {
	f, _ := s.faults.get()
	return f
}

// SetFaults replaces the injected faults. Setting Crash aborts every request
// in flight and restarts the engine empty.
func (s *Server) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.faults.set(f)
	s.crashed = f.Crash
	s.engine.SetSlowdown(f.Slowdown)
	if f.Crash && !old.Crash {
		for id, h := range s.inflight {
			h.aborted = true
			signal(h.notify)
			delete(s.inflight, id)
		}
		e, err := s.newEngine()
		if err != nil { // the config was valid at New: cannot happen
			return fmt.Errorf("restart engine: %w", err)
		}
		s.engine = e
		s.wake()
	}
	return nil
}

var (
	errAborted = errors.New("request aborted by a crash fault")
	errClosed  = errors.New("server closed")
)

// ServeHTTP applies the crash and hang faults, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != adminFaultsPath {
		for {
			f, changed := s.faults.get()
			if f.Crash {
				panic(http.ErrAbortHandler) // net/http closes the connection, answering nothing
			}
			if !f.Hang {
				break
			}
			select {
			case <-changed:
			case <-r.Context().Done():
				return
			case <-s.stop:
				writeError(w, errShuttingDown)
				return
			}
		}
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	handle := func(path, method string, h http.HandlerFunc) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			if r.Method != method {
				w.Header().Set("Allow", method)
				writeError(w, &apiError{status: http.StatusMethodNotAllowed, errType: "MethodNotAllowedError",
					message: fmt.Sprintf("method %s is not allowed on %s; use %s", r.Method, path, method)})
				return
			}
			h(w, r)
		})
	}
	handle("/v1/chat/completions", http.MethodPost, func(w http.ResponseWriter, r *http.Request) { s.handleGenerate(w, r, true) })
	handle("/v1/completions", http.MethodPost, func(w http.ResponseWriter, r *http.Request) { s.handleGenerate(w, r, false) })
	handle("/v1/models", http.MethodGet, s.handleModels)
	handle("/health", http.MethodGet, s.handleHealth)
	handle("/metrics", http.MethodGet, s.handleMetrics)
	handle("/v1/load_lora_adapter", http.MethodPost, s.handleLoadLoRA)
	handle("/v1/unload_lora_adapter", http.MethodPost, s.handleUnloadLoRA)
	mux.HandleFunc(adminFaultsPath, s.handleFaults)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, notFound("", "no route for %s %s", r.Method, r.URL.Path))
	})
	return mux
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, errType: "BadRequestError",
				message: fmt.Sprintf("request body exceeds %d bytes", maxBodyBytes)}
		}
		return nil, badRequest("", "cannot read request body: %v", err)
	}
	return body, nil
}

// resolveModel maps the request's model field to an engine adapter name
// ("" for the base model) and the name echoed in the response.
func (s *Server) resolveModel(model string) (adapter, echo string, aerr *apiError) {
	if model == "" || model == s.model {
		return "", s.model, nil
	}
	s.mu.Lock()
	_, ok := s.adapters[model]
	s.mu.Unlock()
	if !ok {
		return "", "", notFound("model", "The model `%s` does not exist.", model)
	}
	return model, model, nil
}

func (s *Server) handleGenerate(w http.ResponseWriter, r *http.Request, chat bool) {
	body, aerr := readBody(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var g *generationRequest
	if chat {
		g, aerr = parseChat(body)
	} else {
		g, aerr = parseCompletion(body)
	}
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	adapter, echo, aerr := s.resolveModel(g.model)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	h, err := s.submit(g, adapter, echo)
	if errors.Is(err, errAborted) {
		panic(http.ErrAbortHandler)
	}
	var ae *apiError
	if errors.As(err, &ae) {
		writeError(w, ae)
		return
	}
	defer s.release(h)
	if g.stream {
		s.streamResponse(w, r.Context(), g, h)
	} else {
		s.fullResponse(w, r.Context(), g, h)
	}
}

func (s *Server) submit(g *generationRequest, adapter, echo string) (*inflight, error) {
	root := s.model
	if adapter != "" {
		root = adapter
	}
	hashes := engine.HashBlocks(engine.RootHash(root), g.prompt, s.cfg.BlockSize)
	f, _ := s.faults.get()

	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, errShuttingDown
	case s.crashed:
		return nil, errAborted
	case f.ErrorRate > 0 && s.rng.Float64() < f.ErrorRate:
		return nil, errInjected
	}
	maxTokens, reason := g.maxTokens, finishReasonLength
	if maxTokens > 0 {
		if s.outputLength == OutputCeiling && len(g.prompt)+maxTokens > s.cfg.MaxModelLen {
			// judged on the client's max_tokens, as vLLM does, not on the length drawn
			return nil, contextLengthError(s.cfg.MaxModelLen, len(g.prompt), maxTokens, g.chat)
		}
		if n, stopped := s.outputLength.Draw(s.rng, maxTokens); stopped {
			maxTokens, reason = n, finishReasonStop
		}
	} else {
		room := s.cfg.MaxModelLen - len(g.prompt)
		if room < 1 {
			return nil, contextLengthError(s.cfg.MaxModelLen, len(g.prompt), 1, g.chat)
		}
		maxTokens, reason = min(1+s.rng.IntN(s.defaultMaxTokens), room), finishReasonStop
	}
	s.nextID++
	req := &engine.Request{ID: s.nextID, Adapter: adapter, PromptTokens: len(g.prompt), BlockHashes: hashes, MaxTokens: maxTokens}
	now := s.clock.Now()
	if err := s.engine.Submit(now, req); err != nil {
		if errors.Is(err, engine.ErrContextLength) {
			return nil, contextLengthError(s.cfg.MaxModelLen, len(g.prompt), maxTokens, g.chat)
		}
		return nil, badRequest("", "%v", err)
	}
	h := &inflight{
		req:     req,
		respID:  responseID(g.chat, s.seed, req.ID),
		model:   echo,
		created: now.Unix(),
		reason:  reason,
		stream:  g.stream,
		notify:  make(chan struct{}, 1),
	}
	if g.stream && f.DropStreamRate > 0 && s.rng.Float64() < f.DropStreamRate {
		h.dropAfter = max(1, maxTokens/2)
	}
	s.inflight[req.ID] = h
	s.wake()
	return h, nil
}

func contextLengthError(maxLen, prompt, output int, chat bool) *apiError {
	what, param := "prompt", "prompt"
	if chat {
		what, param = "messages", "messages"
	}
	return badRequest(param, "This model's maximum context length is %d tokens. However, you requested %d tokens "+
		"(%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
		maxLen, prompt+output, prompt, what, output, what)
}

func responseID(chat bool, seed, id uint64) string {
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	return prefix + strconv.FormatUint(seed*0x9E3779B97F4A7C15^id, 16)
}

// release ends h's life in the engine: a no-op when it finished, a
// cancellation when the client left or the answer was cut.
func (s *Server) release(h *inflight) {
	s.mu.Lock()
	s.engine.Cancel(h.req)
	delete(s.inflight, h.req.ID)
	s.mu.Unlock()
	s.wake()
}

// progress waits until h has more than sent tokens (or, with untilDone,
// until it is done), or until the request must end.
func (s *Server) progress(ctx context.Context, h *inflight, sent int, untilDone bool) (generated int, done bool, err error) {
	for {
		s.mu.Lock()
		generated, done, aborted := h.generated, h.done, h.aborted
		s.mu.Unlock()
		switch {
		case aborted:
			return 0, false, errAborted
		case done || (!untilDone && generated > sent):
			return generated, done, nil
		}
		select {
		case <-h.notify:
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-s.stop:
			return 0, false, errClosed
		}
	}
}

func (s *Server) fullResponse(w http.ResponseWriter, ctx context.Context, g *generationRequest, h *inflight) {
	generated, _, err := s.progress(ctx, h, 0, true)
	switch {
	case errors.Is(err, errAborted):
		panic(http.ErrAbortHandler)
	case errors.Is(err, errClosed):
		writeError(w, errShuttingDown)
		return
	case err != nil: // the client went away: nobody to answer
		return
	}
	text := make([]byte, 0, generated*4)
	for i := range generated {
		text = append(text, outputToken(s.seed, h.req.ID, i)...)
	}
	content, reason := string(text), h.reason
	setStartHeaders(w.Header(), h.req)
	body := responseBody{ID: h.respID, Created: h.created, Model: h.model, Usage: s.usage(h, generated)}
	if g.chat {
		body.Object = "chat.completion"
		body.Choices = []chatChoice{{Message: &chatOutput{Role: "assistant", Content: &content}, FinishReason: &reason}}
	} else {
		body.Object = "text_completion"
		body.Choices = []completionChoice{{Text: content, FinishReason: &reason}}
	}
	writeJSON(w, http.StatusOK, body)
}

func (s *Server) usage(h *inflight, generated int) *usage {
	return &usage{
		PromptTokens:        h.req.PromptTokens,
		CompletionTokens:    generated,
		TotalTokens:         h.req.PromptTokens + generated,
		PromptTokensDetails: promptTokensDetails{CachedTokens: h.req.CachedTokens()},
	}
}

// streamResponse writes server-sent events as vLLM does: one chunk per token
// (the chat stream opens with a role chunk), finish_reason on the last one,
// then a usage chunk with empty choices when stream_options.include_usage is
// set, then "data: [DONE]". Headers go out with the first token, so errors
// before it are still JSON answers.
func (s *Server) streamResponse(w http.ResponseWriter, ctx context.Context, g *generationRequest, h *inflight) {
	flusher, _ := w.(http.Flusher)
	object := "text_completion"
	if g.chat {
		object = "chat.completion.chunk"
	}
	base := responseBody{ID: h.respID, Object: object, Created: h.created, Model: h.model}
	head, tail := tokenChunkFraming(base, g.chat)
	var buf []byte
	sent, started := 0, false
	for {
		generated, done, err := s.progress(ctx, h, sent, false)
		switch {
		case errors.Is(err, errAborted) || (errors.Is(err, errClosed) && started):
			panic(http.ErrAbortHandler)
		case errors.Is(err, errClosed):
			writeError(w, errShuttingDown)
			return
		case err != nil:
			return
		}
		buf = buf[:0]
		if !started {
			started = true
			w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
			w.Header().Set("Cache-Control", "no-cache")
			setStartHeaders(w.Header(), h.req)
			w.WriteHeader(http.StatusOK)
			if g.chat {
				empty := ""
				role := base
				role.Choices = []chatChoice{{Delta: &chatOutput{Role: "assistant", Content: &empty}}}
				buf = appendEvent(buf, role)
			}
		}
		for ; sent < generated; sent++ {
			tok := outputToken(s.seed, h.req.ID, sent)
			if done && sent == generated-1 {
				last := base
				reason := h.reason
				if g.chat {
					last.Choices = []chatChoice{{Delta: &chatOutput{Content: &tok}, FinishReason: &reason}}
				} else {
					last.Choices = []completionChoice{{Text: tok, FinishReason: &reason}}
				}
				buf = appendEvent(buf, last)
				continue
			}
			buf = append(buf, head...)
			buf = append(buf, tok...)
			buf = append(buf, tail...)
			if h.dropAfter > 0 && sent+1 >= h.dropAfter {
				_, _ = w.Write(buf)
				if flusher != nil {
					flusher.Flush()
				}
				panic(http.ErrAbortHandler) // the drop_stream_rate fault
			}
		}
		if done {
			if g.includeUsage {
				u := base
				u.Choices = []struct{}{}
				u.Usage = s.usage(h, generated)
				buf = appendEvent(buf, u)
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		if _, err := w.Write(buf); err != nil {
			return // the client is gone; release cancels the request
		}
		if flusher != nil {
			flusher.Flush()
		}
		if done {
			return
		}
	}
}

// setStartHeaders sets QueueTimeHeader and FirstTokenTimeHeader for r, which has emitted its first token. The
// handler reads r after progress, which took the lock the engine wrote these times under.
func setStartHeaders(h http.Header, r *engine.Request) {
	h.Set(QueueTimeHeader, strconv.FormatFloat(r.ScheduledAt().Sub(r.Arrival()).Seconds(), 'f', 6, 64))
	h.Set(FirstTokenTimeHeader, strconv.FormatFloat(r.FirstTokenAt().Sub(r.Arrival()).Seconds(), 'f', 6, 64))
}

func appendEvent(buf []byte, v any) []byte {
	body, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("simulator: marshal chunk: %v", err))
	}
	buf = append(buf, "data: "...)
	buf = append(buf, body...)
	return append(buf, "\n\n"...)
}

// tokenChunkFraming pre-renders the JSON around a token's text, so the hot
// path of streaming appends three byte strings instead of marshalling.
// Output tokens come from vocabulary and need no escaping.
func tokenChunkFraming(base responseBody, chat bool) (head, tail []byte) {
	const marker = "\x00TOKEN\x00"
	tok := marker
	if chat {
		base.Choices = []chatChoice{{Delta: &chatOutput{Content: &tok}}}
	} else {
		base.Choices = []completionChoice{{Text: tok}}
	}
	full := appendEvent(nil, base)
	escaped, _ := json.Marshal(marker)
	inner := escaped[1 : len(escaped)-1]
	i := bytes.Index(full, inner)
	return full[:i], full[i+len(inner):]
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	created := s.clock.Now().Unix()
	s.mu.Lock()
	paths := maps.Clone(s.adapters)
	s.mu.Unlock()
	names := slices.Sorted(maps.Keys(paths))
	list := modelList{Object: "list", Data: []modelCard{{ID: s.model, Object: "model", Created: created, OwnedBy: "vllm",
		Root: s.model, MaxModelLen: s.cfg.MaxModelLen}}}
	for _, n := range names {
		parent := s.model
		list.Data = append(list.Data, modelCard{ID: n, Object: "model", Created: created, OwnedBy: "vllm",
			Root: paths[n], Parent: &parent, MaxModelLen: s.cfg.MaxModelLen})
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		writeError(w, errShuttingDown)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	if f, _ := s.faults.get(); f.MetricsDelay > 0 {
		t := s.clock.NewTimer(f.MetricsDelay)
		defer t.Stop()
		select {
		case <-t.C():
		case <-r.Context().Done():
			return
		case <-s.stop:
			writeError(w, errShuttingDown)
			return
		}
	}
	s.metrics.ServeHTTP(w, r)
}

type loraRequest struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path"`
}

func (s *Server) handleLoadLoRA(w http.ResponseWriter, r *http.Request) {
	var req loraRequest
	body, aerr := readBody(w, r)
	if aerr == nil {
		aerr = decodeJSON(body, &req)
	}
	switch {
	case aerr != nil:
	case req.Name == "" || req.Path == "":
		aerr = badRequest("", "Both 'lora_name' and 'lora_path' must be provided.")
	case s.cfg.MaxLoRAs == 0:
		aerr = badRequest("", "LoRA is disabled on this server (max-loras is 0).")
	case req.Name == s.model:
		aerr = badRequest("lora_name", "The lora adapter '%s' has the base model's name.", req.Name)
	}
	if aerr == nil {
		s.mu.Lock()
		if _, ok := s.adapters[req.Name]; ok {
			aerr = &apiError{status: http.StatusBadRequest, errType: "InvalidUserInput",
				message: fmt.Sprintf("The lora adapter '%s' has already been loaded.", req.Name)}
		} else {
			s.adapters[req.Name] = req.Path
		}
		s.mu.Unlock()
	}
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.Name)
}

func (s *Server) handleUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	var req loraRequest
	body, aerr := readBody(w, r)
	if aerr == nil {
		aerr = decodeJSON(body, &req)
	}
	if aerr == nil && req.Name == "" {
		aerr = badRequest("", "'lora_name' needs to be provided to unload a LoRA adapter.")
	}
	if aerr == nil {
		s.mu.Lock()
		if _, ok := s.adapters[req.Name]; ok {
			delete(s.adapters, req.Name)
			s.engine.UnloadAdapter(req.Name)
		} else {
			aerr = notFound("lora_name", "The lora adapter '%s' cannot be found.", req.Name)
		}
		s.mu.Unlock()
	}
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.Name)
}

func (s *Server) handleFaults(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
	case http.MethodPost:
		body, aerr := readBody(w, r)
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		var f Faults
		if err := f.UnmarshalJSON(body); err != nil {
			writeError(w, badRequest("", "invalid faults: %v", err))
			return
		}
		if err := s.SetFaults(f); err != nil {
			writeError(w, badRequest("", "invalid faults: %v", err))
			return
		}
	default:
		w.Header().Set("Allow", "GET, POST")
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, errType: "MethodNotAllowedError",
			message: fmt.Sprintf("method %s is not allowed on %s; use GET or POST", r.Method, adminFaultsPath)})
		return
	}
	writeJSON(w, http.StatusOK, s.Faults())
}
