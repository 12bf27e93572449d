package simulator

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// This file exports what a caller that drives engines without HTTP (a virtual-time benchmark) needs to see requests
// and metrics exactly as a Server does.

// GenerationRequest is a /v1/completions or /v1/chat/completions body as a Server reads it.
type GenerationRequest struct {
	// Chat is true for a chat completion.
	Chat bool
	// Model is the body's model field: the base model or an adapter, "" meaning the base model.
	Model string
	// Prompt holds the prompt's simulated tokens (see ApproximateTokens; chat messages rendered first).
	Prompt []uint32
	// MaxTokens is the requested output length, 0 when unset.
	MaxTokens int
	// Stream and IncludeUsage are the body's stream and stream_options.include_usage.
	Stream, IncludeUsage bool
}

// ParseGenerationRequest parses body as the Server's /v1/chat/completions (chat) or /v1/completions handler does.
// An invalid body yields the error the Server answers; its StatusCode method gives the HTTP status (400).
func ParseGenerationRequest(body []byte, chat bool) (GenerationRequest, error) {
	var g *generationRequest
	var aerr *apiError
	if chat {
		g, aerr = parseChat(body)
	} else {
		g, aerr = parseCompletion(body)
	}
	if aerr != nil {
		return GenerationRequest{}, aerr
	}
	return GenerationRequest{Chat: g.chat, Model: g.model, Prompt: g.prompt, MaxTokens: g.maxTokens, Stream: g.stream,
		IncludeUsage: g.includeUsage}, nil
}

// StatusCode is the HTTP status the Server answers with this error.
func (e *apiError) StatusCode() int { return e.status }

// NewMetricsCollector returns the collector of a Server's engine gauges and counters (every metric of the package
// documentation except the latency histograms and vllm:request_success_total) for an engine the caller drives:
// snapshot returns the engine's Stats and the time of the scrape. Register it on a registry of its own.
func NewMetricsCollector(model string, cfg engine.Config, snapshot func() (engine.Stats, time.Time)) prometheus.Collector {
	return newStateCollector(model, cfg, snapshot)
}
