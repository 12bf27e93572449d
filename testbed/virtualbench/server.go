package virtualbench

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-gw/sluice/testbed/eventclock"
	"github.com/sluice-gw/sluice/testbed/simulator"
	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// server is one simulated vLLM server without HTTP: the engine, plus what simulator.Server does around it when a
// request arrives (parse the body, resolve the model, draw an output length, hash the prompt's blocks) and its
// /metrics page, produced by the simulator's own collector.
type server struct {
	idx      int
	name     string // 127.0.0.1:port, the routing name
	pod      string
	model    string
	adapters map[string]bool
	maxOut   int // DefaultMaxTokens
	outLen   simulator.OutputLength
	cfg      engine.Config
	eng      *engine.Engine
	rng      *rand.Rand

	step   *eventclock.Event // the pending Advance, if any
	stepAt time.Time
	sent   uint64      // attempts routed here
	blips  []time.Time // Config.Blips of this server not yet answered, ascending
}

func newServer(idx int, cfg engine.Config, c *Config, observer engine.Observer) (*server, error) {
	port := strconv.Itoa(BasePort + idx)
	s := &server{
		idx:      idx,
		name:     net.JoinHostPort("127.0.0.1", port),
		pod:      "static-127-0-0-1-" + port,
		model:    c.Model,
		adapters: map[string]bool{},
		maxOut:   c.DefaultMaxTokens,
		outLen:   c.OutputLength,
		cfg:      cfg,
	}
	seed := c.ServerSeed + uint64(idx)
	s.rng = rand.New(rand.NewPCG(seed, seed^0x5eed)) // as simulator.New seeds it
	for _, m := range c.LoRAModules {
		s.adapters[m] = true
	}
	eng, err := engine.NewEngine(cfg, observer)
	if err != nil {
		return nil, fmt.Errorf("server %d: %w", idx, err)
	}
	for _, a := range c.PreloadLoRAs {
		if err := eng.PreloadAdapter(a); err != nil {
			return nil, fmt.Errorf("server %d: %w", idx, err)
		}
	}
	s.eng = eng
	return s, nil
}

// httpError is a server's error answer.
type httpError struct {
	status  int
	message string
}

// accept is simulator.Server's handling of a generation request up to engine.Submit: parse, resolve the model,
// choose the output length, hash the prompt. id becomes the engine request's ID.
func (s *server) accept(now time.Time, body []byte, chat bool, id uint64) (*engine.Request, *httpError) {
	g, err := simulator.ParseGenerationRequest(body, chat)
	if err != nil {
		status := 400
		var se interface{ StatusCode() int }
		if errors.As(err, &se) {
			status = se.StatusCode()
		}
		return nil, &httpError{status, err.Error()}
	}
	adapter := ""
	if g.Model != "" && g.Model != s.model {
		if !s.adapters[g.Model] {
			return nil, &httpError{404, fmt.Sprintf("The model `%s` does not exist.", g.Model)}
		}
		adapter = g.Model
	}
	root := s.model
	if adapter != "" {
		root = adapter
	}
	maxTokens := g.MaxTokens
	if maxTokens > 0 {
		if s.outLen == simulator.OutputCeiling && len(g.Prompt)+maxTokens > s.cfg.MaxModelLen {
			// judged on the client's max_tokens, as vLLM does, not on the length drawn
			return nil, &httpError{400, fmt.Sprintf("This model's maximum context length is %d tokens; the prompt has %d and max_tokens is %d",
				s.cfg.MaxModelLen, len(g.Prompt), maxTokens)}
		}
		maxTokens, _ = s.outLen.Draw(s.rng, maxTokens)
	} else {
		room := s.cfg.MaxModelLen - len(g.Prompt)
		if room < 1 {
			return nil, &httpError{400, fmt.Sprintf("This model's maximum context length is %d tokens; the prompt has %d",
				s.cfg.MaxModelLen, len(g.Prompt))}
		}
		maxTokens = min(1+s.rng.IntN(s.maxOut), room)
	}
	req := &engine.Request{ID: id, Adapter: adapter, PromptTokens: len(g.Prompt),
		BlockHashes: engine.HashBlocks(engine.RootHash(root), g.Prompt, s.cfg.BlockSize), MaxTokens: maxTokens}
	if err := s.eng.Submit(now, req); err != nil {
		return nil, &httpError{400, err.Error()}
	}
	return req, nil
}

// families is what the EPP's metrics data source would parse from the server's /metrics at now: the simulator's
// gauges and counters (simulator.MetricFamilies, equal to what its registry serves).
func (s *server) families(now time.Time) map[string]*dto.MetricFamily {
	return simulator.MetricFamilies(s.model, s.cfg, s.eng.Stats(), now)
}

// usage is the usage object a simulated server reports.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	TotalTokens         int `json:"total_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// lastChunk is the end of a successful response as the EPP's response path sees it: for a stream, the usage event
// (when the client asked for it) and [DONE]; otherwise the body's usage.
func lastChunk(r *engine.Request, stream, includeUsage bool) []byte {
	var u usage
	u.PromptTokens, u.CompletionTokens = r.PromptTokens, r.Generated()
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	u.PromptTokensDetails.CachedTokens = r.CachedTokens()
	body, _ := json.Marshal(struct {
		Choices []struct{} `json:"choices"`
		Usage   usage      `json:"usage"`
	}{Choices: []struct{}{}, Usage: u})
	switch {
	case !stream:
		return body
	case includeUsage:
		return append(append([]byte("data: "), body...), "\n\ndata: [DONE]\n\n"...)
	default:
		return []byte("data: [DONE]\n\n")
	}
}

// errorBody is a server's error answer as an OpenAI-style body.
func errorBody(e *httpError) []byte {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": e.message, "code": e.status}})
	return body
}
