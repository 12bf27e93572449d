package plugins_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/runner/runnertest"
)

// These tests run the real EPP binary in static mode against fake model servers and drive its ext_proc service as
// Envoy does, so Sluice admission is checked through upstream's request path: the Director, errcommon's mapping to
// an immediate response, the runner's response shapers, the scheduler with the headroom filter, and /metrics.
// Waiting here is on real processes (startup, scrapes), never a stand-in for logic.

var fcPrompt atomic.Int64

func fcCompletion() map[string]any {
	return map[string]any{"model": "base", "prompt": fmt.Sprintf("prompt %d", fcPrompt.Add(1)), "max_tokens": 16}
}

// startFCEPP runs the EPP in plaintext with args.
func startFCEPP(t *testing.T, args ...string) *runnertest.Process {
	t.Helper()
	if testing.Short() {
		t.Skip("process test: runs the EPP binary")
	}
	return runnertest.StartEPP(t, nil, append(args, "--secure-serving=false")...)
}

// send routes one request through the EPP's ext_proc service.
func send(t *testing.T, epp *runnertest.Process, headers map[string]string, body any) runnertest.Answer {
	t.Helper()
	return runnertest.Route(t, epp.GRPCPort, false, headers, body, nil)
}

// checkShed verifies a Sluice rejection: status, Retry-After in whole seconds, the reason header and an OpenAI error
// whose code is the reason.
func checkShed(t *testing.T, a runnertest.Answer, status int, errType string, reasons ...string) {
	t.Helper()
	if a.Status != status {
		t.Fatalf("answer %+v, want status %d", a, status)
	}
	if s, err := strconv.Atoi(a.Headers["retry-after"]); err != nil || s < 1 {
		t.Errorf("Retry-After = %q, want whole seconds >= 1", a.Headers["retry-after"])
	}
	reason := a.Headers[plugins.ShedReasonHeader]
	known := false
	for _, r := range reasons {
		known = known || r == reason
	}
	if !known {
		t.Errorf("%s = %q, want one of %v", plugins.ShedReasonHeader, reason, reasons)
	}
	var body struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(a.Body), &body); err != nil || body.Error.Type != errType || body.Error.Code != reason || body.Error.Message == "" {
		t.Errorf("body %q: want an OpenAI error of type %s and code %s (%v)", a.Body, errType, reason, err)
	}
	if a.Headers["content-type"] != "application/json" {
		t.Errorf("content-type = %q", a.Headers["content-type"])
	}
}

func TestFlowControlProcessShedsWithRetryAfter(t *testing.T) {
	server := runnertest.StartModelServer(t, "127.0.0.1:0")
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(`
bands:
  standard:
    maxQueueTime: 1s
tenants:
- name: batch
  maxBand: Sheddable
endpoint:
  metricsStalenessThreshold: 3s # scrapes on a busy test machine can lag
`), 0o600); err != nil {
		t.Fatal(err)
	}
	epp := startFCEPP(t, "--static-endpoints="+server.Addr, "--flow-control-config="+policy, "--v=3")
	batch := map[string]string{"x-gateway-inference-fairness-id": "batch"}

	runnertest.Eventually(t, "an idle endpoint admits and routes", func() string {
		if a := send(t, epp, batch, fcCompletion()); a.Destination != server.Addr {
			return fmt.Sprintf("answer %+v, want routed to %s", a, server.Addr)
		}
		return ""
	})

	server.Waiting.Store(50) // the model server's queue is full
	var shed runnertest.Answer
	runnertest.Eventually(t, "a Sheddable request on a full pool is shed", func() string {
		shed = send(t, epp, batch, fcCompletion())
		if shed.Status == 0 {
			return "still routed: the EPP has not scraped the full queue yet"
		}
		return ""
	})
	checkShed(t, shed, 429, "rate_limit_error", "saturated")

	// A Standard request waits for its band's maximum queue time (1s), then is shed.
	checkShed(t, send(t, epp, nil, fcCompletion()), 429, "rate_limit_error", "queue_timeout", "predicted_wait")

	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", epp.MetricsPort))
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`sluice_flowcontrol_shed_total{band="Sheddable",outcome="rejected",reason="saturated"`, "inference_pool_"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// Shedding is designed behaviour: one info line per shed request at -v=3, no error lines, no stack traces. The
	// EPP writes the line before it answers, but the test reads the EPP's output through a pipe that a goroutine of
	// its own copies: the line may not be in Output yet when the answer is.
	var notAdmitted, shedLines []string
	runnertest.Eventually(t, "the EPP's lines about the 2 requests shed with 429 are read", func() string {
		notAdmitted, shedLines = nil, nil
		for _, line := range strings.Split(epp.Output.String(), "\n") {
			if !strings.Contains(line, "Request not admitted") {
				continue
			}
			notAdmitted = append(notAdmitted, line)
			if strings.Contains(line, `"status":429`) {
				shedLines = append(shedLines, line)
			}
		}
		if len(shedLines) < 2 {
			return fmt.Sprintf("%d lines read", len(shedLines))
		}
		return ""
	})
	for _, line := range notAdmitted {
		if strings.Contains(line, `"level":"error"`) {
			t.Errorf("shedding logged as an error: %s", line)
		}
	}
	if len(shedLines) != 2 {
		t.Errorf("%d log lines about the 2 requests shed with 429, want 2:\n%s", len(shedLines), strings.Join(shedLines, "\n"))
	}
	for _, line := range shedLines {
		if !strings.Contains(line, `"level":"info"`) || strings.Contains(line, "stacktrace") {
			t.Errorf("shed logged as %s, want one info line", line)
		}
	}
}

func TestFlowControlProcessUnavailableWithoutFreshEndpoints(t *testing.T) {
	// Nothing listens on the endpoint, so its metrics are never fresh: once the warm-up has passed without any,
	// requests are answered 503.
	epp := startFCEPP(t, fmt.Sprintf("--static-endpoints=127.0.0.1:%d", runnertest.FreePort(t)), "--sluice-admission",
		"--flow-control-warmup=300ms")
	checkShed(t, send(t, epp, nil, fcCompletion()), 503, "service_unavailable_error", "no_endpoints")
}

func TestFlowControlProcessOffKeepsUpstreamAdmission(t *testing.T) {
	server := runnertest.StartModelServer(t, "127.0.0.1:0")
	server.Waiting.Store(50)
	epp := startFCEPP(t, "--static-endpoints="+server.Addr)
	// Upstream's legacy admission sheds only negative priorities; a full queue does not stop a default request.
	runnertest.Eventually(t, "routed as upstream does", func() string {
		a := send(t, epp, map[string]string{"x-gateway-inference-fairness-id": "batch"}, fcCompletion())
		if a.Destination != server.Addr {
			return fmt.Sprintf("answer %+v", a)
		}
		return ""
	})
}

// TestFlowControlProcessTenantIdentity runs the EPP with a policy that caps every tenant but "gold" at Standard and
// refuses objectives above a cap (403). With tenantHeader set, only the gateway's header names the tenant: a client
// claiming "gold" in x-gateway-inference-fairness-id is refused its Critical objective. With the default, the client's
// fairness header is trusted, as it was before tenantHeader existed.
func TestFlowControlProcessTenantIdentity(t *testing.T) {
	server := runnertest.StartModelServer(t, "127.0.0.1:0")
	dir := t.TempDir()
	objectives := filepath.Join(dir, "objectives.yaml")
	if err := os.WriteFile(objectives, []byte(`apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: chat-critical}
spec: {priority: 10, poolRef: {name: static}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(t *testing.T, tenantHeader string) *runnertest.Process {
		policy := filepath.Join(t.TempDir(), "policy.yaml")
		if err := os.WriteFile(policy, []byte(tenantHeader+`
aboveMaxBand: Reject
tenants: [{name: gold}]
defaultTenant: {maxBand: Standard}
endpoint: {metricsStalenessThreshold: 3s}
`), 0o600); err != nil {
			t.Fatal(err)
		}
		epp := startFCEPP(t, "--static-endpoints="+server.Addr, "--flow-control-config="+policy, "--inference-objectives-file="+objectives)
		runnertest.Eventually(t, "an idle endpoint admits and routes", func() string {
			if a := send(t, epp, nil, fcCompletion()); a.Destination != server.Addr {
				return fmt.Sprintf("answer %+v, want routed to %s", a, server.Addr)
			}
			return ""
		})
		return epp
	}
	const objective = "x-gateway-inference-objective"
	refused := func(t *testing.T, a runnertest.Answer, tenant string) {
		t.Helper()
		var body struct {
			Error struct{ Message, Type, Code string } `json:"error"`
		}
		if a.Status != http.StatusForbidden || a.Headers["retry-after"] != "" || a.Headers[plugins.ShedReasonHeader] != "band_not_allowed" ||
			json.Unmarshal([]byte(a.Body), &body) != nil || body.Error.Type != "permission_error" || body.Error.Code != "band_not_allowed" ||
			!strings.Contains(body.Error.Message, `tenant "`+tenant+`" may not use the Critical band`) {
			t.Errorf("answer %+v, want 403 band_not_allowed for tenant %q without Retry-After", a, tenant)
		}
	}

	t.Run("the gateway's header names the tenant", func(t *testing.T) {
		epp := start(t, "tenantHeader: x-auth-tenant")
		if a := send(t, epp, map[string]string{"x-auth-tenant": "gold", objective: "chat-critical"}, fcCompletion()); a.Destination != server.Addr {
			t.Errorf("gold's Critical request: %+v, want routed", a)
		}
		refused(t, send(t, epp, map[string]string{"x-gateway-inference-fairness-id": "gold", objective: "chat-critical"}, fcCompletion()), "default-flow")
		refused(t, send(t, epp, map[string]string{"x-auth-tenant": "silver", "x-gateway-inference-fairness-id": "gold", objective: "chat-critical"}, fcCompletion()), "silver")
		if a := send(t, epp, map[string]string{"x-auth-tenant": "silver"}, fcCompletion()); a.Destination != server.Addr {
			t.Errorf("silver's Standard request: %+v, want routed", a)
		}
		if want := `sluice_flowcontrol_shed_total{band="Critical",outcome="rejected",reason="band_not_allowed",tenant="silver"} 1`; !strings.Contains(epp.Metrics(t), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	})
	t.Run("by default the client's fairness header is trusted", func(t *testing.T) {
		epp := start(t, "")
		if a := send(t, epp, map[string]string{"x-gateway-inference-fairness-id": "gold", objective: "chat-critical"}, fcCompletion()); a.Destination != server.Addr {
			t.Errorf("a client claiming gold: %+v, want routed", a)
		}
		refused(t, send(t, epp, map[string]string{objective: "chat-critical"}, fcCompletion()), "default-flow")
	})
}
