package loadgen

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Record is one attempt of one request. A request that was retried after a
// Retry-After has one record per attempt; the last has Final set.
type Record struct {
	Seq         int    `json:"seq"`
	Attempt     int    `json:"attempt"` // 1-based
	Final       bool   `json:"final"`
	Class       string `json:"class"`
	Model       string `json:"model"`
	Stream      bool   `json:"stream"`
	PrefixGroup int    `json:"prefix_group"`
	ChatID      int    `json:"chat_id"`
	Turn        int    `json:"turn"`
	// PromptTokens is estimated by the CharsPerToken rule; MaxTokens is the
	// requested output length.
	PromptTokens int `json:"prompt_tokens"`
	MaxTokens    int `json:"max_tokens"`

	// Scheduled is when the arrival process wanted the request sent (open
	// loop), Start when this attempt was sent, both from the run start.
	Scheduled time.Duration `json:"scheduled_ns"`
	Start     time.Duration `json:"start_ns"`
	// SinceFirstAttempt is Start minus the first attempt's Start.
	SinceFirstAttempt time.Duration `json:"since_first_attempt_ns"`

	// Status is the HTTP status (0 if no response arrived).
	Status int `json:"status"`
	// Error describes a failure: transport error, non-2xx body excerpt,
	// broken or incomplete stream. Empty on success.
	Error string `json:"error,omitempty"`
	// TTFT is the time from sending to the first content chunk (streaming)
	// or to the complete body (non-streaming). Zero if no content arrived.
	TTFT time.Duration `json:"ttft_ns"`
	// ITL are the gaps between successive content chunks.
	ITL []time.Duration `json:"itl_ns,omitempty"`
	// E2E is the time from sending to the end of the response.
	E2E time.Duration `json:"e2e_ns"`
	// OutputTokens is usage.completion_tokens when reported, else the number
	// of content chunks.
	OutputTokens int `json:"output_tokens"`
	// RetryAfter is the parsed Retry-After header, if any (RetryAfterSet).
	RetryAfter    time.Duration `json:"retry_after_ns,omitempty"`
	RetryAfterSet bool          `json:"retry_after_set,omitempty"`
	// Endpoint is x-gateway-destination-endpoint-served from the response,
	// when the data plane reports it.
	Endpoint string `json:"endpoint,omitempty"`
	// ServerQueue and ServerTTFT are the server's own account of the
	// attempt's start, when it gives one (the simulator's x-sim-queue-seconds
	// and x-sim-first-token-seconds; ServerTTFT is 0 without them): the time
	// from its arrival at the server to its first scheduling into the running
	// batch, and to its first token. TTFT - ServerTTFT is the way there:
	// routing, queueing in the gateway, proxies.
	ServerQueue time.Duration `json:"server_queue_ns,omitempty"`
	ServerTTFT  time.Duration `json:"server_ttft_ns,omitempty"`
	// EPPTime is the data plane's account of how long the attempt waited on the EPP before its response headers
	// (x-dataplane-epp-seconds): the EPP hop's part of TTFT. 0 without an EPP or without the header.
	EPPTime time.Duration `json:"epp_ns,omitempty"`
	// RequestID is the x-request-id the gateway gave the attempt, when it says so in the response (the data plane's
	// --request-id-in-response, Envoy's always_set_request_id_in_response): the key of the EPP's decision trace.
	RequestID string `json:"request_id,omitempty"`
	// Target is the index in RunConfig.Targets of the gateway the request
	// went through; 0 with one target.
	Target int `json:"target,omitempty"`
}

// maxRequestIDBytes bounds the request ID a record keeps; a longer one is not the gateway's and is dropped.
const maxRequestIDBytes = 128

// parseRequestID fills RequestID from a response's headers.
func (r *Record) parseRequestID(h http.Header) {
	if id := h.Get("X-Request-Id"); len(id) <= maxRequestIDBytes {
		r.RequestID = id
	}
}

// eppTimeHeader is the data plane's EPPTimeHeader (duplicated: loadgen is a client and imports no proxy code).
const eppTimeHeader = "x-dataplane-epp-seconds"

// parseEPPTime fills EPPTime from a response's headers; a missing or malformed value leaves it zero.
func (r *Record) parseEPPTime(h http.Header) {
	if s, err := strconv.ParseFloat(h.Get(eppTimeHeader), 64); err == nil && s > 0 && s < 1e6 {
		r.EPPTime = time.Duration(s * float64(time.Second))
	}
}

// Headers of the simulated model server (package simulator's
// QueueTimeHeader and FirstTokenTimeHeader, duplicated: loadgen is a client
// and imports no server code).
const (
	serverQueueHeader = "x-sim-queue-seconds"
	serverTTFTHeader  = "x-sim-first-token-seconds"
)

// parseServerTimes fills ServerQueue and ServerTTFT from a response's
// headers; a missing or malformed pair leaves both zero.
func (r *Record) parseServerTimes(h http.Header) {
	q, errQ := strconv.ParseFloat(h.Get(serverQueueHeader), 64)
	f, errF := strconv.ParseFloat(h.Get(serverTTFTHeader), 64)
	if errQ != nil || errF != nil || q < 0 || f <= 0 || q > f {
		return
	}
	r.ServerQueue = time.Duration(q * float64(time.Second))
	r.ServerTTFT = time.Duration(f * float64(time.Second))
}

// OK reports whether the attempt succeeded: a 2xx answer whose body or
// stream completed.
func (r *Record) OK() bool {
	return r.Status >= 200 && r.Status < 300 && r.Error == ""
}

// MeanITL is the mean inter-token latency, or 0 with fewer than two chunks.
func (r *Record) MeanITL() time.Duration {
	if len(r.ITL) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range r.ITL {
		sum += d
	}
	return sum / time.Duration(len(r.ITL))
}

// ParseRetryAfter parses a Retry-After value (RFC 9110 section 10.2.3):
// delay-seconds or an HTTP-date, relative to now. A date in the past is a
// zero delay.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 || secs > int64(24*time.Hour/time.Second) {
			return 0, false
		}
		return time.Duration(secs) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
