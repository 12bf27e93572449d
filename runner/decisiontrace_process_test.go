package runner_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/plugins/decisiontrace"
	"github.com/sluice-gw/sluice/runner"
	"github.com/sluice-gw/sluice/runner/runnertest"
)

// decisions reads the EPP's decision trace for request id ("" for all); status is the HTTP status.
func decisions(t *testing.T, epp *runnertest.Process, id string) (page decisiontrace.Page, status int) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s?request_id=%s", epp.MetricsPort, runner.DecisionTracePath, id))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
			t.Fatal(err)
		}
	}
	return page, resp.StatusCode
}

var traceRequests atomic.Int64

// traced sends a request for model as tenant through the EPP, opted in to the decision trace when optIn, and returns
// its request ID and answer.
func traced(t *testing.T, epp *runnertest.Process, model, tenant string, optIn bool) (string, runnertest.Answer) {
	t.Helper()
	id := fmt.Sprintf("trace-%d", traceRequests.Add(1))
	headers := map[string]string{"x-request-id": id, "x-gateway-inference-fairness-id": tenant}
	if optIn {
		headers["x-sluice-trace"] = "1"
	}
	body := map[string]any{"model": model, "prompt": "why here? " + id, "max_tokens": 8}
	return id, runnertest.Route(t, epp.GRPCPort, false, headers, body, nil)
}

// TestDecisionTraceProcess runs the EPP with Sluice admission and the decision trace on, over two servers of
// different base models, and reads the trace from the metrics port: a routed request's record names the endpoint,
// what each filter removed and every scorer's score, and is logged at decisiontrace.LogLevel; a shed request's names
// its band and shed reason; a request that did not opt in is not recorded; and with the trace off there is nothing to
// read.
func TestDecisionTraceProcess(t *testing.T) {
	port := runnertest.FreePort(t)
	base := runnertest.StartModelServerOf(t, fmt.Sprintf("127.0.0.2:%d", port), "base")
	other := runnertest.StartModelServerOf(t, fmt.Sprintf("127.0.0.3:%d", port), "other")
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("tenants:\n- name: batch\n  maxBand: Sheddable\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	epp := runnertest.StartEPP(t, nil, "--static-endpoints="+base.Addr+","+other.Addr, "--secure-serving=false",
		"--flow-control-config="+policy, "--decision-trace=100", "--decision-trace-header=x-sluice-trace", "--decision-trace-rate=0",
		fmt.Sprintf("--v=%d", decisiontrace.LogLevel))

	var id string
	runnertest.Eventually(t, "a request for base is routed", func() string {
		var a runnertest.Answer
		if id, a = traced(t, epp, "base", "", true); a.Destination != base.Addr {
			return fmt.Sprintf("answer %+v, want routed to %s", a, base.Addr)
		}
		return ""
	})
	page, status := decisions(t, epp, id)
	if status != http.StatusOK || len(page.Decisions) != 1 {
		t.Fatalf("status %d, decisions %+v: want the record of %s", status, page.Decisions, id)
	}
	rec := page.Decisions[0]
	if rec.Outcome != decisiontrace.Routed || rec.Endpoint != base.Addr || rec.Model != "base" {
		t.Errorf("record %+v, want routed to %s for base", rec, base.Addr)
	}
	if rec.Admission == nil || rec.Admission.Band != "Standard" || rec.Admission.Outcome != "dispatched" {
		t.Errorf("admission %+v, want Standard dispatched", rec.Admission)
	}
	if len(rec.Profiles) != 1 {
		t.Fatalf("profiles %+v", rec.Profiles)
	}
	prof := rec.Profiles[0]
	if len(prof.Filters) == 0 || prof.Filters[0].Plugin != plugins.ServedModelFilterType ||
		!slices.Equal(prof.Filters[0].Removed, []string{other.Addr}) {
		t.Errorf("filters %+v, want %s to remove %s first", prof.Filters, plugins.ServedModelFilterType, other.Addr)
	}
	if len(prof.Endpoints) != 1 || prof.Endpoints[0].Endpoint != base.Addr || len(prof.Endpoints[0].Scores) != len(prof.Scorers) ||
		len(prof.Scorers) == 0 || !slices.Equal(prof.Picked, []string{base.Addr}) {
		t.Errorf("scores %+v by %+v, picked %v: want every scorer's score of %s, picked", prof.Endpoints, prof.Scorers, prof.Picked, base.Addr)
	}

	runnertest.Eventually(t, "the decision is logged", func() string {
		for _, line := range strings.Split(epp.Output.String(), "\n") {
			if strings.Contains(line, "Routing decision") && strings.Contains(line, id) && strings.Contains(line, plugins.ServedModelFilterType) {
				return ""
			}
		}
		return "no log line names the decision"
	})

	// Not opted in: routed, not recorded.
	plain, a := traced(t, epp, "base", "", false)
	if a.Destination == "" {
		t.Fatalf("answer %+v", a)
	}
	if page, _ := decisions(t, epp, plain); len(page.Decisions) != 0 {
		t.Errorf("a request without the opt-in header was recorded: %+v", page.Decisions)
	}

	// Shed: every endpoint is above the Sheddable ceiling.
	base.Waiting.Store(50)
	other.Waiting.Store(50)
	runnertest.Eventually(t, "a Sheddable request is shed", func() string {
		if id, a = traced(t, epp, "base", "batch", true); a.Status != http.StatusTooManyRequests {
			return fmt.Sprintf("answer %+v, want 429", a)
		}
		return ""
	})
	page, _ = decisions(t, epp, id)
	if len(page.Decisions) != 1 {
		t.Fatalf("decisions %+v, want the shed request's", page.Decisions)
	}
	rec = page.Decisions[0]
	if rec.Outcome != decisiontrace.Answered || rec.Status != 429 || rec.ShedReason != "saturated" || rec.RetryAfter == "" ||
		rec.Admission == nil || rec.Admission.Band != "Sheddable" || !rec.Admission.Capped || rec.Admission.Reason != "saturated" ||
		len(rec.Profiles) != 0 {
		t.Errorf("record %+v (admission %+v), want shed as saturated in the Sheddable band, never scheduled", rec, rec.Admission)
	}

	t.Run("off", func(t *testing.T) {
		off := runnertest.StartEPP(t, nil, "--static-endpoints="+base.Addr, "--secure-serving=false", "--sluice-admission")
		if _, status := decisions(t, off, ""); status != http.StatusNotFound {
			t.Errorf("%s answered %d with the trace off, want 404", runner.DecisionTracePath, status)
		}
	})
}
