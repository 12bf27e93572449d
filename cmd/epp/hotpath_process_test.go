package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/runner/runnertest"
)

// TestSluiceAdmissionTakesTheHotPath streams a chat of eight chunks through the EPP with Sluice admission and counts,
// in upstream's per-plugin latency histogram, the response-body plugin runs it caused: on the runner's hot path the
// Director hears the first chunk (Sluice admission acts on it) and the end, and runs every response-body plugin on
// those two; upstream's path runs them on all eight.
func TestSluiceAdmissionTakesTheHotPath(t *testing.T) {
	server := runnertest.StartModelServer(t, "127.0.0.1:0").Addr
	epp := runnertest.StartEPP(t, nil, "--static-endpoints="+server, "--secure-serving=false", "--sluice-admission")
	body := map[string]any{"model": "base", "stream": true, "messages": []map[string]string{{"role": "user", "content": "hi"}}}
	event := `data: {"id":"c","object":"chat.completion.chunk","model":"base","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n"
	reply := runnertest.Reply{ContentType: "text/event-stream"}
	for range 7 {
		reply.Chunks = append(reply.Chunks, event)
	}
	reply.Chunks = append(reply.Chunks, "data: [DONE]\n\n")

	// Sluice admission answers 503 until it has read the endpoint's metrics: wait for a routed request.
	runnertest.Eventually(t, "a routed request", func() string {
		if x := runnertest.Exchange(t, epp.GRPCPort, nil, body, reply); x.Destination != server {
			return fmt.Sprintf("answered %d %s", x.Status, x.Body)
		}
		return ""
	})
	before := responsePluginRuns(t, epp.Metrics(t))
	x := runnertest.Exchange(t, epp.GRPCPort, nil, body, reply)
	if x.Destination != server || len(x.ResponseChunks) != len(reply.Chunks) {
		t.Fatalf("routed to %q with %d of %d chunks back, want %s and all", x.Destination, len(x.ResponseChunks), len(reply.Chunks), server)
	}
	after := responsePluginRuns(t, epp.Metrics(t))
	for typ, want := range map[string]int{plugins.FlowControlType: 2, plugins.PrefixCacheType: 2} {
		if got := after[typ] - before[typ]; got != want {
			t.Errorf("%s ran on %d response-body messages of one request, want %d", typ, got, want)
		}
	}
}

var (
	responsePluginCount = regexp.MustCompile(`^inference_extension_plugin_duration_seconds_count\{([^}]*)\} (\d+)$`)
	pluginTypeLabel     = regexp.MustCompile(`plugin_type="([^"]*)"`)
)

// responsePluginRuns reads, from a /metrics page, how often each response-body plugin type has run.
func responsePluginRuns(t *testing.T, page string) map[string]int {
	t.Helper()
	runs := map[string]int{}
	for line := range strings.Lines(page) {
		m := responsePluginCount.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil || !strings.Contains(m[1], `extension_point="ResponseStreaming"`) {
			continue
		}
		typ := pluginTypeLabel.FindStringSubmatch(m[1])
		n, err := strconv.Atoi(m[2])
		if typ == nil || err != nil {
			t.Fatalf("unreadable metric line %q", line)
		}
		runs[typ[1]] += n
	}
	return runs
}
