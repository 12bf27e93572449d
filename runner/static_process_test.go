package runner_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

func TestStaticEndpointsMode(t *testing.T) {
	port := runnertest.FreePort(t)
	a := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.2:%d", port)).Addr
	b := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.3:%d", port)).Addr

	t.Run("list routes to the listed endpoints and honours subset hints", func(t *testing.T) {
		epp := runnertest.StartEPP(t, nil, "--static-endpoints="+a+","+b, "--secure-serving=false")
		tls := false
		runnertest.Eventually(t, "both endpoints serve", func() string {
			seen := destinations(t, epp.GRPCPort, tls, 20, nil)
			if msg := onlyIn(seen, a, b); msg != "" {
				return msg
			}
			if len(seen) != 2 {
				return fmt.Sprintf("only %v received traffic", seen)
			}
			return ""
		})
		if msg := onlyIn(destinations(t, epp.GRPCPort, tls, 10, []string{b}), b); msg != "" {
			t.Fatalf("subset hint ignored: %s", msg)
		}
	})

	t.Run("file is re-read while running", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "endpoints")
		write := func(content string) {
			t.Helper()
			tmp := file + ".tmp"
			if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, file); err != nil {
				t.Fatal(err)
			}
		}
		write("# fleet\n" + a + "\n")
		epp := runnertest.StartEPP(t, nil, "--static-endpoints-file="+file, "--static-endpoints-reload-interval=100ms", "--secure-serving=false")
		tls := false
		if msg := onlyIn(destinations(t, epp.GRPCPort, tls, 10, nil), a); msg != "" {
			t.Fatal(msg)
		}
		write(b + " # moved\n")
		runnertest.Eventually(t, "traffic moves to the new endpoint", func() string { return onlyIn(destinations(t, epp.GRPCPort, tls, 10, nil), b) })
		write("not-an-endpoint\n")
		runnertest.Eventually(t, "a broken file is reported", func() string {
			if !strings.Contains(epp.Output.String(), "Keeping the previous static endpoints") {
				return "no log line about the broken file"
			}
			return ""
		})
		if msg := onlyIn(destinations(t, epp.GRPCPort, tls, 10, nil), b); msg != "" {
			t.Fatalf("a broken file must keep the last good endpoints: %s", msg)
		}
	})

	t.Run("TLS with a self-signed certificate by default", func(t *testing.T) {
		epp := runnertest.StartEPP(t, nil, "--static-endpoints="+a)
		tls := true
		if msg := onlyIn(destinations(t, epp.GRPCPort, tls, 5, nil), a); msg != "" {
			t.Fatal(msg)
		}
	})

	t.Run("profiles on the metrics port, CPU included", func(t *testing.T) {
		get := func(port int, path string) (int, []byte) {
			t.Helper()
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			return resp.StatusCode, body
		}
		epp := runnertest.StartEPP(t, nil, "--static-endpoints="+a, "--secure-serving=false")
		for _, path := range []string{"/debug/pprof/heap", "/debug/pprof/profile?seconds=1"} {
			// A profile is a gzipped protocol buffer.
			if status, body := get(epp.MetricsPort, path); status != http.StatusOK || !bytes.HasPrefix(body, []byte{0x1f, 0x8b}) {
				t.Errorf("GET %s: status %d, %d bytes (%.40q), want 200 and a gzipped profile", path, status, len(body), body)
			}
		}
		off := runnertest.StartEPP(t, nil, "--static-endpoints="+a, "--secure-serving=false", "--enable-pprof=false")
		if status, _ := get(off.MetricsPort, "/debug/pprof/profile?seconds=1"); status != http.StatusNotFound {
			t.Errorf("--enable-pprof=false: CPU profile status %d, want 404", status)
		}
	})

	t.Run("bad request gets an OpenAI-style JSON error", func(t *testing.T) {
		epp := runnertest.StartEPP(t, nil, "--static-endpoints="+a, "--secure-serving=false")
		tls := false
		r := runnertest.Route(t, epp.GRPCPort, tls, nil, map[string]any{"prompt": "no model"}, nil)
		if r.Status != 400 {
			t.Fatalf("status = %d (%q), want 400", r.Status, r.Body)
		}
		var body struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(r.Body), &body); err != nil || body.Error.Type != "invalid_request_error" || body.Error.Message == "" {
			t.Fatalf("body %q is not an OpenAI error (%v)", r.Body, err)
		}
		if r.Headers["content-type"] != "application/json" {
			t.Fatalf("content-type = %q", r.Headers["content-type"])
		}
	})
}

func TestCommandLine(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantExit int
		want     []string
	}{
		{"help lists upstream and Sluice flags", []string{"--help"}, 0,
			[]string{"--pool-name", "--pool-namespace", "--pool-group", "--endpoint-selector", "--endpoint-target-ports",
				"--grpc-port", "--grpc-health-port", "--metrics-port", "--config-file", "--config-text", "--secure-serving",
				"--cert-path", "--enable-cert-reload", "--metrics-endpoint-auth", "--ha-enable-leader-election",
				"--refresh-metrics-interval", "--metrics-staleness-threshold", "--zap-log-level", "-v, --v",
				"--static-endpoints", "--static-endpoints-file", "--version"}},
		{"version", []string{"--version"}, 0, []string{"sluice-epp", "gateway-api-inference-extension v1.5.0", "commit"}},
		{"static mixed with pool", []string{"--static-endpoints=127.0.0.1:1", "--pool-name=p"}, 1,
			[]string{"cannot be combined with --pool-name or --endpoint-selector"}},
		{"unknown flag", []string{"--no-such-flag"}, 1, []string{"unknown flag: --no-such-flag"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := exec.Command(runnertest.EPPPath(t), tt.args...).CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.wantExit {
				t.Fatalf("exit %d, want %d\n%s", code, tt.wantExit, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q\n%s", w, out)
				}
			}
		})
	}
}

// conformanceConfig returns the EndpointPickerConfig that upstream's v1.5.0
// conformance suite deploys (resources/base.yaml, ConfigMap plugins-config),
// read from the conformance module itself so it is used unchanged.
func conformanceConfig(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", "sigs.k8s.io/gateway-api-inference-extension/conformance@v1.5.0")
	cmd.Env = append(os.Environ(), "GONOSUMDB=sigs.k8s.io/gateway-api-inference-extension/conformance", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("downloading the conformance module: %v", err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download: %v (%s)", err, out)
	}
	base, err := os.ReadFile(filepath.Join(mod.Dir, "resources", "base.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The config is the literal block under "conformance-plugins.yaml: |".
	lines := strings.Split(string(base), "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "conformance-plugins.yaml: |" {
			continue
		}
		indent := ""
		var cfg []string
		for _, body := range lines[i+1:] {
			if indent == "" {
				indent = body[:len(body)-len(strings.TrimLeft(body, " "))]
			}
			if !strings.HasPrefix(body, indent) || strings.TrimSpace(body) == "---" {
				break
			}
			cfg = append(cfg, strings.TrimPrefix(body, indent))
		}
		return strings.Join(cfg, "\n")
	}
	t.Fatal("conformance-plugins.yaml not found in the conformance resources")
	return ""
}

// TestConfigsLoad starts the EPP with upstream's conformance config, unchanged,
// and with a config that names Sluice plugins next to upstream ones, and
// checks each routes as configured.
func TestConfigsLoad(t *testing.T) {
	port := runnertest.FreePort(t)
	a := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.2:%d", port)).Addr
	b := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.3:%d", port)).Addr

	t.Run("upstream conformance config", func(t *testing.T) {
		cfg := conformanceConfig(t)
		for _, want := range []string{"header-based-testing-filter", "destination-endpoint-served-verifier"} {
			if !strings.Contains(cfg, want) {
				t.Fatalf("conformance config lacks %s:\n%s", want, cfg)
			}
		}
		epp := runnertest.StartEPP(t, nil, "--static-endpoints="+a+","+b, "--secure-serving=false", "--config-text="+cfg)
		for _, target := range []string{a, b, a} {
			r := runnertest.Route(t, epp.GRPCPort, false, map[string]string{"test-epp-endpoint-selection": target}, completion("conformance"), nil)
			if r.Destination != target {
				t.Fatalf("header-based-testing-filter asked for %s, EPP answered %+v", target, r)
			}
		}
	})

	t.Run("Sluice plugins beside upstream ones", func(t *testing.T) {
		cfg := `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: sluice-prefix-cache-scorer
- type: sluice-lora-affinity-scorer
- type: sluice-headroom-filter
- type: max-score-picker
- type: sluice-openai-parser
parser:
  pluginRef: sluice-openai-parser
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: sluice-headroom-filter
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: sluice-prefix-cache-scorer
    weight: 3
  - pluginRef: sluice-lora-affinity-scorer
    weight: 1
  - pluginRef: max-score-picker
`
		epp := runnertest.StartEPP(t, nil, "--static-endpoints="+a+","+b, "--secure-serving=false", "--config-text="+cfg)
		if msg := onlyIn(destinations(t, epp.GRPCPort, false, 10, nil), a, b); msg != "" {
			t.Fatal(msg)
		}
	})

	t.Run("unknown plugin type is a clear startup error", func(t *testing.T) {
		out, err := exec.Command(runnertest.EPPPath(t), "--static-endpoints="+a, "--config-text=apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: no-such-plugin\n").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "no-such-plugin") {
			t.Fatalf("err %v, output:\n%s", err, out)
		}
	})
}

// TestMetricLabelsBounded sends requests for more distinct models than
// --metrics-max-label-values allows: upstream's request metrics, labelled by
// the model each client names, keep the first ones and count the rest under
// "other" on the EPP's /metrics.
func TestMetricLabelsBounded(t *testing.T) {
	server := runnertest.StartModelServer(t, "127.0.0.1:0")
	epp := runnertest.StartEPP(t, nil, "--static-endpoints="+server.Addr, "--secure-serving=false", "--metrics-max-label-values=2")
	scrape := func() string {
		t.Helper()
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", epp.MetricsPort))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		page, _ := io.ReadAll(resp.Body)
		return string(page)
	}
	for i := range 5 {
		body := map[string]any{"model": fmt.Sprintf("model-%d", i), "prompt": "hi", "max_tokens": 1}
		if a := runnertest.Route(t, epp.GRPCPort, false, nil, body, nil); a.Destination != server.Addr {
			t.Fatalf("request %d: %+v", i, a)
		}
		scrape() // values are admitted in the order scrapes first see them
	}
	page := scrape()
	var series []string
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "inference_objective_request_total{") {
			series = append(series, line)
		}
	}
	want := []string{
		`inference_objective_request_total{model_name="model-0",priority="0",target_model_name="model-0"} 1`,
		`inference_objective_request_total{model_name="model-1",priority="0",target_model_name="model-1"} 1`,
		`inference_objective_request_total{model_name="other",priority="0",target_model_name="other"} 3`,
	}
	if !slices.Equal(series, want) {
		t.Errorf("request_total series:\n%s\nwant:\n%s", strings.Join(series, "\n"), strings.Join(want, "\n"))
	}
}
