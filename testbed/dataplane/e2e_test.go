package dataplane

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/runner/runnertest"
	"github.com/sluice-gw/sluice/testbed/simulator"
	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// startSimulator serves one simulated vLLM server on ip and returns its
// host:port.
func startSimulator(t *testing.T, ip, profile string) string {
	t.Helper()
	cfg, err := engine.Profile(profile)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := simulator.New(simulator.Options{Model: "base", Engine: cfg, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv}
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() {
		_ = hs.Close()
		srv.Close()
	})
	return l.Addr().String()
}

// chatCompletion posts body as JSON to the data plane's chat endpoint.
func chatCompletion(t *testing.T, url string, body any) (int, http.Header, string) {
	t.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return post(t, url+"/v1/chat/completions", string(raw))
}

// startEPPDataPlane serves a data plane that asks the EPP on eppPort and
// returns its base URL.
func startEPPDataPlane(t *testing.T, eppPort int) string {
	t.Helper()
	proxy, _ := startProxy(t, Config{EPPAddress: fmt.Sprintf("127.0.0.1:%d", eppPort), ReportServedHeader: true})
	return proxy.URL
}

func chat(content string, stream bool) map[string]any {
	body := map[string]any{
		"model":      "base",
		"messages":   []map[string]string{{"role": "user", "content": content}},
		"max_tokens": 8,
		"stream":     stream,
	}
	if stream {
		body["stream_options"] = map[string]bool{"include_usage": true}
	}
	return body
}

// TestEndToEnd sends HTTP requests through the data plane, which asks the
// real Sluice EPP (static mode) where to send them, to real simulated vLLM
// servers on loopback.
func TestEndToEnd(t *testing.T) {
	a := startSimulator(t, "127.0.0.2", "h100")
	b := startSimulator(t, "127.0.0.3", "a10g")
	epp := runnertest.StartEPP(t, nil, "--static-endpoints="+a+","+b, "--secure-serving=false")
	url := startEPPDataPlane(t, epp.GRPCPort)

	t.Run("chat", func(t *testing.T) {
		status, header, body := chatCompletion(t, url, chat("hello", false))
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, body)
		}
		var out struct {
			Model   string `json:"model"`
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(body), &out); err != nil || len(out.Choices) != 1 || out.Model != "base" {
			t.Fatalf("unexpected body %q (%v)", body, err)
		}
		served := header.Get("x-gateway-destination-endpoint-served")
		if served != a && served != b {
			t.Fatalf("served by %q, want one of %s, %s", served, a, b)
		}
	})

	t.Run("streaming chat", func(t *testing.T) {
		raw, _ := json.Marshal(chat("stream please", true))
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(string(raw)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("content-type"), "text/event-stream") {
			t.Fatalf("status %d, content-type %q", resp.StatusCode, resp.Header.Get("content-type"))
		}
		var events []string
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events = append(events, line)
			}
		}
		if len(events) < 3 || events[len(events)-1] != "[DONE]" {
			t.Fatalf("stream ended badly: %v", events)
		}
		if !strings.Contains(events[len(events)-2], `"usage"`) {
			t.Fatalf("no usage chunk before [DONE]: %s", events[len(events)-2])
		}
	})

	t.Run("immediate 4xx from the EPP passes through with its headers", func(t *testing.T) {
		status, header, body := chatCompletion(t, url, map[string]any{"messages": "not a list"})
		if status != http.StatusBadRequest {
			t.Fatalf("status %d, want 400: %s", status, body)
		}
		if ct := header.Get("content-type"); ct != "application/json" {
			t.Fatalf("content-type %q, want the EPP's application/json", ct)
		}
		var e struct {
			Error struct{ Type, Message string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Type != "invalid_request_error" {
			t.Fatalf("body %q is not the EPP's OpenAI error (%v)", body, err)
		}
	})
}

// TestEndToEndFallback lists a dead endpoint among live ones and has the EPP
// return every endpoint in random order, so the data plane must fall back
// along the list whenever the dead one comes first (with 40 requests and 3
// endpoints, the chance that it never comes first is (2/3)^40, about 1e-7).
func TestEndToEndFallback(t *testing.T) {
	a := startSimulator(t, "127.0.0.2", "h100")
	b := startSimulator(t, "127.0.0.3", "h100")
	dead := fmt.Sprintf("127.0.0.4:%d", runnertest.FreePort(t))
	config := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(config, []byte(`apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: random-picker
  parameters:
    maxNumOfEndpoints: 3
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: random-picker
`), 0o644); err != nil {
		t.Fatal(err)
	}
	epp := runnertest.StartEPP(t, nil, "--static-endpoints="+dead+","+a+","+b, "--secure-serving=false", "--config-file="+config)
	url := startEPPDataPlane(t, epp.GRPCPort)
	for i := range 40 {
		status, header, body := chatCompletion(t, url, chat(fmt.Sprintf("request %d", i), false))
		if status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, status, body)
		}
		if served := header.Get("x-gateway-destination-endpoint-served"); served != a && served != b {
			t.Fatalf("request %d served by %q", i, served)
		}
	}
}
