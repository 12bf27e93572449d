package conformance

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Requests and the checks cases share.

var promptSeq atomic.Int64

// uniquePrompt differs from every other prompt of the run from its first
// characters, so prefix-cache scoring finds no affinity between requests.
func uniquePrompt() string {
	return fmt.Sprintf("%d-%d: a conformance prompt, say something short", time.Now().UnixNano(), promptSeq.Add(1))
}

// ChatFor is an OpenAI chat completion body for model.
func ChatFor(model, prompt string, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{
		"model":      model,
		"messages":   []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": 8,
		"stream":     stream,
	})
	return b
}

// Chat is a non-streamed chat completion for Model with prompt.
func Chat(prompt string) []byte { return ChatFor(Model, prompt, false) }

// ChatCompletionReply is a model server's non-streamed answer naming model.
func ChatCompletionReply(model string) *Reply {
	return &Reply{
		Headers: map[string]string{"content-type": "application/json"},
		Chunks: [][]byte{[]byte(`{"id":"cmpl-1","object":"chat.completion","model":"` + model +
			`","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],` +
			`"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`)},
	}
}

// maxRetryAfter caps how long exchange waits before it retries a request
// an EPP answered 503 with Retry-After.
const maxRetryAfter = 2 * time.Second

// exchange sends req with the case's deadline, failing the case on a
// broken stream or a hang. An immediate 503 with Retry-After (an EPP's
// admission saying "not now") is retried once after that delay, at most
// maxRetryAfter, as an HTTP client honouring it would; the retry is logged
// and its answer counts.
func (f *Fixture) exchange(t *T, req Request) *Decision {
	t.Helper()
	d, err := f.Envoy.Exchange(t.Context(), req)
	if err == nil && d.Immediate != nil && d.Immediate.Status == 503 {
		if after, ok := d.Immediate.Headers["retry-after"]; ok {
			secs, _ := strconv.Atoi(after)
			wait := min(time.Duration(max(secs, 0))*time.Second, maxRetryAfter)
			t.Logf("503 with Retry-After %q (%s): retrying once after %v, as a client would", after, d.Immediate.Body, wait)
			time.Sleep(wait)
			d, err = f.Envoy.Exchange(t.Context(), req)
		}
	}
	if err != nil {
		t.Fatalf("ext_proc exchange: %v", err)
	}
	return d
}

// route sends req and requires a routing decision (no immediate response)
// whose header and envoy.lb metadata agree; it returns the endpoints named.
func (f *Fixture) route(t *T, req Request) []string {
	t.Helper()
	d := f.exchange(t, req)
	if d.Immediate != nil {
		t.Fatalf("want the request routed, got an immediate response %d: %s", d.Immediate.Status, d.Immediate.Body)
	}
	if d.Destination() == "" {
		t.Fatalf("no %s header in the request headers answer", "x-gateway-destination-endpoint")
	}
	if d.Destination() != d.MetadataDestination() {
		t.Fatalf("header %q and envoy.lb metadata %q name different endpoints", d.Destination(), d.MetadataDestination())
	}
	return splitEndpoints(d.Destination())
}

// routeCounts routes n fresh chat requests with subset and counts the
// primary endpoint chosen.
func (f *Fixture) routeCounts(t *T, n int, subset []string) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for range n {
		eps := f.route(t, Request{Body: Chat(uniquePrompt()), Subset: subset})
		seen[eps[0]]++
	}
	return seen
}

// requireImmediate sends req and requires an immediate response with one of
// statuses, observing its shape.
func (f *Fixture) requireImmediate(t *T, req Request, statuses ...int) *Immediate {
	t.Helper()
	d := f.exchange(t, req)
	if d.Immediate == nil {
		t.Fatalf("want an immediate response %v, got the request routed to %q", statuses, d.Destination())
	}
	observeImmediate(t, d.Immediate)
	if !slices.Contains(statuses, d.Immediate.Status) {
		t.Errorf("immediate response status %d, want %v (body %q)", d.Immediate.Status, statuses, d.Immediate.Body)
	}
	return d.Immediate
}

// observeImmediate records an immediate response's shape: status, body
// kind, content type and the headers clients act on.
func observeImmediate(t *T, im *Immediate) {
	t.Observe("status", "%d", im.Status)
	t.Observe("body", "%s", bodyKind(im.Body))
	t.Observe("content-type", "%s", orDash(im.Headers["content-type"]))
	_, retry := im.Headers["retry-after"]
	t.Observe("retry-after", "%v", retry)
}

// bodyKind classifies an error body: empty, an OpenAI error object, other
// JSON, or text.
func bodyKind(b []byte) string {
	if len(strings.TrimSpace(string(b))) == 0 {
		return "empty"
	}
	var v struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &v) == nil {
		if v.Error != nil && v.Error.Message != "" && v.Error.Type != "" {
			return "openai-error-json"
		}
		return "json"
	}
	return "text"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// splitEndpoints splits a destination list ("ip:port,ip:port").
func splitEndpoints(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		out = append(out, strings.TrimSpace(p))
	}
	return out
}

// validEndpoint reports whether s is ip:port with a numeric port.
func validEndpoint(s string) bool {
	host, port, err := net.SplitHostPort(s)
	if err != nil || net.ParseIP(host) == nil {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n > 0 && n < 65536
}

// onlyIn fails the case unless every endpoint in seen is one of allowed.
func onlyIn(t *T, seen map[string]int, allowed ...string) {
	t.Helper()
	for ep := range seen {
		if !slices.Contains(allowed, ep) {
			t.Errorf("routed to %s, want only %v (all: %v)", ep, allowed, seen)
		}
	}
}
