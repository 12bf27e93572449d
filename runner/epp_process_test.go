package runner_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

func completion(prompt string) map[string]any {
	return map[string]any{"model": "base", "prompt": prompt, "max_tokens": 8}
}

// destinations routes n distinct requests through the EPP on port and returns
// how often each endpoint was chosen; it fails the test on an answer whose
// header and envoy.lb metadata disagree.
func destinations(t *testing.T, port int, useTLS bool, n int, subset []string) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for i := range n {
		a := runnertest.Route(t, port, useTLS, nil, completion(fmt.Sprintf("prompt %d %d", i, time.Now().UnixNano())), subset)
		if a.Status != 0 {
			t.Fatalf("request %d: immediate response %d: %s", i, a.Status, a.Body)
		}
		if a.Destination == "" || a.Destination != a.Metadata {
			t.Fatalf("request %d: header %q and envoy.lb metadata %q must both name the endpoint", i, a.Destination, a.Metadata)
		}
		seen[a.Destination]++
	}
	return seen
}

func onlyIn(seen map[string]int, allowed ...string) string {
	for ep := range seen {
		ok := false
		for _, a := range allowed {
			ok = ok || ep == a
		}
		if !ok {
			return fmt.Sprintf("routed to %s, want only %v (all: %v)", ep, allowed, seen)
		}
	}
	return ""
}
