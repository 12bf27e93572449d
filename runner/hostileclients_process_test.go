package runner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// TestHostileClients runs the EPP binary with Sluice admission under a tenant policy and sends it what a hostile or
// broken client can put through a gateway that forwards everything: a body over the size limit, a body that is not
// JSON, thousands of headers, header values that are not UTF-8, an objective that does not exist, a tenant asking
// above its cap with a huge name, a body sent slowly, and a body abandoned halfway. Each is routed or gets an
// OpenAI-style error with the status that says why; the EPP survives all of them, keeps routing, and holds nothing
// afterwards (no queued request in any band).
func TestHostileClients(t *testing.T) {
	server := runnertest.StartModelServer(t, "127.0.0.1:0")
	dir := t.TempDir()
	files := map[string]string{
		"policy.yaml": "tenantHeader: x-auth-tenant\naboveMaxBand: Reject\ntenants: [{name: gold}]\ndefaultTenant: {maxBand: Standard}\n",
		"objectives.yaml": `apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: critical}
spec: {priority: 10, poolRef: {name: static}}
`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const maxBody = 64 << 10
	epp := runnertest.StartEPP(t, nil, "--static-endpoints="+server.Addr, "--secure-serving=false",
		"--flow-control-config="+filepath.Join(dir, "policy.yaml"), "--inference-objectives-file="+filepath.Join(dir, "objectives.yaml"),
		fmt.Sprintf("--model-selection-max-body-bytes=%d", maxBody))
	routes := func() string {
		if a := runnertest.Route(t, epp.GRPCPort, false, nil, completion("are you there?"), nil); a.Destination != server.Addr {
			return fmt.Sprintf("answer %+v, want routed to %s", a, server.Addr)
		}
		return ""
	}
	runnertest.Eventually(t, "a well-formed request is routed", routes)

	flood := map[string]string{}
	for i := range 2000 {
		flood[fmt.Sprintf("x-flood-%d", i)] = strings.Repeat("f", 64)
	}
	tests := []struct {
		name    string
		send    func(t *testing.T) runnertest.Answer
		status  int    // 0: routed
		errType string // the OpenAI error type of an immediate response
		message string // a regexp the error message matches
	}{
		{name: "body over the size limit", status: http.StatusRequestEntityTooLarge, errType: "invalid_request_error", message: fmt.Sprintf("%d bytes", maxBody),
			send: func(t *testing.T) runnertest.Answer {
				return runnertest.Route(t, epp.GRPCPort, false, nil, completion(strings.Repeat("x", 2*maxBody)), nil)
			}},
		{name: "body not JSON", status: http.StatusBadRequest, errType: "invalid_request_error", message: ".",
			send: func(t *testing.T) runnertest.Answer {
				return sendRaw(t, epp.GRPCPort, nil, 0, `{"model": "base", "prompt": `)
			}},
		{name: "2000 headers", send: func(t *testing.T) runnertest.Answer {
			return runnertest.Route(t, epp.GRPCPort, false, flood, completion("flood"), nil)
		}},
		{name: "header values not UTF-8", send: func(t *testing.T) runnertest.Answer {
			return runnertest.Route(t, epp.GRPCPort, false, map[string]string{"x-auth-tenant": "gold\xff", "x-gateway-inference-objective": "critical\xfe",
				"x-gateway-inference-fairness-id": "\xc3", "x-session-id": "\xff\xff"}, completion("bytes"), nil)
		}},
		{name: "model rewrite header not UTF-8", send: func(t *testing.T) runnertest.Answer {
			return runnertest.Route(t, epp.GRPCPort, false, map[string]string{"x-gateway-model-name-rewrite": "\xc3base"}, completion("bytes"), nil)
		}},
		{name: "objective that does not exist", send: func(t *testing.T) runnertest.Answer {
			return runnertest.Route(t, epp.GRPCPort, false, map[string]string{"x-gateway-inference-objective": "platinum-please"}, completion("bogus"), nil)
		}},
		{name: "tenant above its cap, with a huge name", status: http.StatusForbidden, errType: "permission_error", message: `may not use the Critical band`,
			send: func(t *testing.T) runnertest.Answer {
				return runnertest.Route(t, epp.GRPCPort, false, map[string]string{"x-auth-tenant": strings.Repeat("t", 32<<10),
					"x-gateway-inference-objective": "critical"}, completion("cap"), nil)
			}},
		{name: "body sent slowly", send: func(t *testing.T) runnertest.Answer {
			return sendRaw(t, epp.GRPCPort, nil, 300*time.Millisecond, `{"model": "base", `, `"prompt": "slowly", `, `"max_tokens": 8}`)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := tt.send(t)
			if tt.status == 0 {
				if a.Status != 0 || a.Destination != server.Addr {
					t.Fatalf("answer %+v, want routed to %s", a, server.Addr)
				}
				return
			}
			var body struct {
				Error struct{ Message, Type string } `json:"error"`
			}
			if a.Status != tt.status || json.Unmarshal([]byte(a.Body), &body) != nil || body.Error.Type != tt.errType ||
				!regexp.MustCompile(tt.message).MatchString(body.Error.Message) {
				t.Fatalf("answer %d %.300s, want %d with an OpenAI %s matching %q", a.Status, a.Body, tt.status, tt.errType, tt.message)
			}
		})
	}

	t.Run("body abandoned halfway", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		stream := openStream(t, ctx, epp.GRPCPort)
		send(t, stream, requestHeaders(nil), &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model": "base", "prompt": "and then`)}}})
		time.Sleep(100 * time.Millisecond) // let the EPP take the first chunk before the client goes
		cancel()
	})

	if msg := routes(); msg != "" {
		t.Fatalf("after the hostile requests: %s", msg)
	}
	page := epp.Metrics(t)
	queued := regexp.MustCompile(`(?m)^sluice_flowcontrol_queue_length\{band="(\w+)"\} (\S+)$`).FindAllStringSubmatch(page, -1)
	if len(queued) != 3 {
		t.Fatalf("/metrics has %d queue_length series, want one per band:\n%s", len(queued), page)
	}
	for _, q := range queued {
		if q[2] != "0" {
			t.Errorf("band %s holds %s requests after every client is gone", q[1], q[2])
		}
	}
}

// sendRaw sends request headers and then the body chunks as they are, pausing between chunks, the last ending the
// stream, and returns the EPP's answer.
func sendRaw(t *testing.T, port int, headers map[string]string, pause time.Duration, chunks ...string) runnertest.Answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream := openStream(t, ctx, port)
	send(t, stream, requestHeaders(headers))
	for i, c := range chunks {
		if i > 0 {
			time.Sleep(pause)
		}
		send(t, stream, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: []byte(c), EndOfStream: i == len(chunks)-1}}})
	}
	var a runnertest.Answer
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("ext_proc stream ended without an answer: %v", err)
		}
		if ir := resp.GetImmediateResponse(); ir != nil {
			a.Status, a.Body = int(ir.GetStatus().GetCode()), string(ir.Body)
			return a
		}
		for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if strings.EqualFold(h.Header.Key, "x-gateway-destination-endpoint") {
				a.Destination = string(h.Header.RawValue) + h.Header.Value
				return a
			}
		}
	}
}

func openStream(t *testing.T, ctx context.Context, port int) extprocv3.ExternalProcessor_ProcessClient {
	t.Helper()
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

func send(t *testing.T, stream extprocv3.ExternalProcessor_ProcessClient, msgs ...*extprocv3.ProcessingRequest) {
	t.Helper()
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
}

func requestHeaders(extra map[string]string) *extprocv3.ProcessingRequest {
	hm := &corev3.HeaderMap{}
	for k, v := range map[string]string{":method": "POST", ":path": "/v1/completions", ":authority": "gateway", "content-type": "application/json"} {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	for k, v := range extra {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}}
}
