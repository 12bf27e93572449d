package dataplane

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	envoytypev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func decodeAPIError(t *testing.T, body string) apiErrorBody {
	t.Helper()
	var e apiError
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == "" {
		t.Fatalf("body is not an OpenAI-style error: %q (%v)", body, err)
	}
	return e.Error
}

func TestEPPMutatesAndRoutes(t *testing.T) {
	a := startBackend(t, "a", nil)
	b := startBackend(t, "b", nil)
	rewritten := []byte(`{"model":"rewritten","prompt":"hi"}`)
	epp := startFakeEPP(t, eppBehaviour{
		decide: func(s *seenExchange) []*extprocv3.ProcessingResponse {
			msgs := routeTo(b.addr(), rewritten)(s)
			hm := msgs[0].GetRequestHeaders().GetResponse().GetHeaderMutation()
			hm.SetHeaders = append(hm.SetHeaders, setHeaders("x-added", "yes", "x-envoy-forbidden", "no", ":path", "/v1/rewritten")...)
			hm.RemoveHeaders = []string{"x-remove-me"}
			return msgs
		},
		responseMutation: &extprocv3.HeaderMutation{SetHeaders: setHeaders("x-went-into-resp-headers", "true"), RemoveHeaders: []string{"x-backend"}},
		bufferResponse:   true,
	})
	proxy, rec := startProxy(t, Config{EPPAddress: epp.addr, ReportServedHeader: true})

	code, hdr, body := post(t, proxy.URL+"/v1/completions?x=1", `{"model":"orig","prompt":"hi"}`,
		"X-Remove-Me", "1", "X-Gateway-Destination-Endpoint", a.addr(), "X-Gateway-Inference-Objective", "critical",
		"X-Request-Id", "chosen-by-client")
	if code != http.StatusOK {
		t.Fatalf("status %d, body %s", code, body)
	}
	if want := `{"backend":"b","model":"m"}`; body != want {
		t.Errorf("client body %q, want %q", body, want)
	}
	if hdr.Get("X-Went-Into-Resp-Headers") != "true" || hdr.Get("X-Backend") != "" {
		t.Errorf("response header mutation not applied: %v", hdr)
	}
	if got := hdr.Get("X-Gateway-Destination-Endpoint-Served"); got != b.addr() {
		t.Errorf("served header %q, want %q", got, b.addr())
	}
	if s, err := strconv.ParseFloat(hdr.Get(EPPTimeHeader), 64); err != nil || s <= 0 {
		t.Errorf("%s %q, want the time the request waited on the EPP", EPPTimeHeader, hdr.Get(EPPTimeHeader))
	}
	if n, _, _ := a.received(); n != 0 {
		t.Errorf("client-chosen destination was honoured: backend a got %d requests", n)
	}
	n, bodies, headers := b.received()
	if n != 1 || bodies[0] != string(rewritten) {
		t.Fatalf("backend b got %d requests, bodies %q; want the rewritten body", n, bodies)
	}
	h := headers[0]
	if h.Get("X-Added") != "yes" || h.Get("X-Remove-Me") != "" || h.Get("X-Envoy-Forbidden") != "" {
		t.Errorf("request header mutation not applied as Envoy does: %v", h)
	}
	if h.Get("X-Request-Id") == "" || h.Get("X-Gateway-Inference-Objective") != "critical" {
		t.Errorf("upstream headers missing x-request-id or objective: %v", h)
	}

	ex := epp.exchanges()
	if len(ex) != 1 {
		t.Fatalf("EPP saw %d streams, want 1", len(ex))
	}
	s := ex[0]
	if s.protocolConfig.GetRequestBodyMode() != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED ||
		s.protocolConfig.GetResponseBodyMode() != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		t.Errorf("protocol config %v, want FULL_DUPLEX_STREAMED both ways", s.protocolConfig)
	}
	for k, want := range map[string]string{
		":method": "POST", ":path": "/v1/completions?x=1", ":scheme": "http", "content-type": "application/json",
		"x-gateway-inference-objective": "critical",
	} {
		if s.requestHeaders[k] != want {
			t.Errorf("EPP saw %s=%q, want %q", k, s.requestHeaders[k], want)
		}
	}
	if id := s.requestHeaders["x-request-id"]; s.requestHeaders[":authority"] == "" || id == "" || id == "chosen-by-client" {
		t.Errorf("EPP headers lack :authority or a generated x-request-id (the client's must be replaced): %v", s.requestHeaders)
	}
	if _, ok := s.requestHeaders["x-gateway-destination-endpoint"]; ok {
		t.Errorf("client-supplied destination header reached the EPP")
	}
	if s.headersEOS || string(s.requestBody) != `{"model":"orig","prompt":"hi"}` {
		t.Errorf("EPP got headersEOS=%v body %q", s.headersEOS, s.requestBody)
	}
	if s.responseHeaders[":status"] != "200" {
		t.Errorf("EPP response headers %v lack :status 200", s.responseHeaders)
	}
	served, _ := s.responseMetadata["envoy.lb"].(map[string]any)
	if served["x-gateway-destination-endpoint-served"] != b.addr() {
		t.Errorf("EPP response metadata %v, want served endpoint %s", s.responseMetadata, b.addr())
	}
	if outcomes, _, _ := rec.snapshot(1); !slices.Equal(outcomes, []Outcome{OutcomeProxied}) {
		t.Errorf("outcomes %v", outcomes)
	}
}

func TestEPPPathRewriteReachesUpstream(t *testing.T) {
	var gotPath string
	b := startBackend(t, "b", func(w http.ResponseWriter, r *http.Request) { gotPath = r.URL.RequestURI() })
	epp := startFakeEPP(t, eppBehaviour{decide: func(s *seenExchange) []*extprocv3.ProcessingResponse {
		msgs := routeTo(b.addr(), nil)(s)
		hm := msgs[0].GetRequestHeaders().GetResponse().GetHeaderMutation()
		hm.SetHeaders = append(hm.SetHeaders, setHeaders(":path", "/v1/other?y=2")...)
		return msgs
	}})
	proxy, _ := startProxy(t, Config{EPPAddress: epp.addr})
	if code, _, body := post(t, proxy.URL+"/v1/completions", `{}`); code != 200 {
		t.Fatalf("status %d %s", code, body)
	}
	if gotPath != "/v1/other?y=2" {
		t.Errorf("upstream path %q, want the EPP's :path", gotPath)
	}
}

func TestEPPRoutesByDynamicMetadataAlone(t *testing.T) {
	b := startBackend(t, "b", nil)
	epp := startFakeEPP(t, eppBehaviour{decide: func(s *seenExchange) []*extprocv3.ProcessingResponse {
		r := headersResponse(nil)
		r.DynamicMetadata = lbMetadata(b.addr())
		return append([]*extprocv3.ProcessingResponse{r}, bodyResponses(s.requestBody)...)
	}})
	proxy, _ := startProxy(t, Config{EPPAddress: epp.addr})
	if code, _, body := post(t, proxy.URL+"/v1/completions", `{"model":"m"}`); code != 200 || !strings.Contains(body, `"backend":"b"`) {
		t.Fatalf("status %d body %q, want backend b", code, body)
	}
}

func TestEPPFallsBackWhenFirstEndpointRefuses(t *testing.T) {
	b := startBackend(t, "b", nil)
	dead := refusedAddr(t)
	epp := startFakeEPP(t, eppBehaviour{decide: routeTo(dead+","+b.addr(), nil)})
	proxy, _ := startProxy(t, Config{EPPAddress: epp.addr, ReportServedHeader: true})

	code, hdr, body := post(t, proxy.URL+"/v1/completions", `{"model":"m"}`)
	if code != 200 || !strings.Contains(body, `"backend":"b"`) {
		t.Fatalf("status %d body %q, want backend b", code, body)
	}
	if hdr.Get("X-Gateway-Destination-Endpoint-Served") != b.addr() {
		t.Errorf("served header %q, want %s", hdr.Get("X-Gateway-Destination-Endpoint-Served"), b.addr())
	}
	served, _ := epp.exchanges()[0].responseMetadata["envoy.lb"].(map[string]any)
	if served["x-gateway-destination-endpoint-served"] != b.addr() {
		t.Errorf("EPP was told %v served, want %s", served, b.addr())
	}
}

func TestEPPImmediateResponsePassedThrough(t *testing.T) {
	b := startBackend(t, "b", nil)
	const errBody = `{"error":{"message":"shed","type":"rate_limit","param":null,"code":"sheddable"}}`
	epp := startFakeEPP(t, eppBehaviour{decide: func(*seenExchange) []*extprocv3.ProcessingResponse {
		return []*extprocv3.ProcessingResponse{immediate(envoytypev3.StatusCode_TooManyRequests, errBody,
			"retry-after", "7", "content-type", "application/json")}
	}})
	proxy, rec := startProxy(t, Config{EPPAddress: epp.addr})

	code, hdr, body := post(t, proxy.URL+"/v1/completions", `{"model":"m"}`)
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") != "7" || hdr.Get("Content-Type") != "application/json" || body != errBody {
		t.Fatalf("got %d %v %q; want 429 with Retry-After 7 and the JSON body", code, hdr, body)
	}
	if n, _, _ := b.received(); n != 0 {
		t.Errorf("backend was called %d times", n)
	}
	if outcomes, _, _ := rec.snapshot(1); !slices.Equal(outcomes, []Outcome{OutcomeImmediate}) {
		t.Errorf("outcomes %v", outcomes)
	}
}

// TestRequestIDInResponse: with Config.RequestIDInResponse the client gets the x-request-id the proxy gave its
// request (the one the EPP saw), whoever answered, as Envoy's always_set_request_id_in_response; without it, none.
func TestRequestIDInResponse(t *testing.T) {
	const id = "proxy-chosen"
	upstream := startBackend(t, "b", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Request-Id", "upstream-chosen")
		_, _ = io.WriteString(w, `{}`)
	})
	routed := startFakeEPP(t, eppBehaviour{decide: routeTo(upstream.addr(), nil)})
	shed := startFakeEPP(t, eppBehaviour{decide: func(*seenExchange) []*extprocv3.ProcessingResponse {
		return []*extprocv3.ProcessingResponse{immediate(envoytypev3.StatusCode_TooManyRequests, `{}`, "retry-after", "1")}
	}})
	for _, tc := range []struct {
		name   string
		cfg    Config
		status int
		want   string
	}{
		{"routed, the upstream's own ID replaced", Config{EPPAddress: routed.addr, RequestIDInResponse: true}, http.StatusOK, id},
		{"answered by the EPP", Config{EPPAddress: shed.addr, RequestIDInResponse: true}, http.StatusTooManyRequests, id},
		{"EPP unreachable", Config{EPPAddress: refusedAddr(t), RequestIDInResponse: true}, http.StatusInternalServerError, id},
		{"off: the upstream's header passes", Config{EPPAddress: routed.addr}, http.StatusOK, "upstream-chosen"},
		{"off, answered by the EPP", Config{EPPAddress: shed.addr}, http.StatusTooManyRequests, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.NewRequestID = func() string { return id }
			proxy, _ := startProxy(t, tc.cfg)
			code, hdr, body := post(t, proxy.URL+"/v1/completions", `{"model":"m"}`, "X-Request-Id", "chosen-by-client")
			if code != tc.status || hdr.Get("X-Request-Id") != tc.want {
				t.Errorf("got %d with x-request-id %q (body %q), want %d with %q", code, hdr.Get("X-Request-Id"), body, tc.status, tc.want)
			}
		})
	}
	if ex := routed.exchanges(); len(ex) == 0 || ex[0].requestHeaders["x-request-id"] != id {
		t.Errorf("the EPP did not see the ID the client got: %v", ex)
	}
}

// TestEPPImmediateResponseLocalReplyMapping: with Config.EPPFailureRetryAfter, an EPP's ImmediateResponse is an Envoy
// local reply: one of 503 without a Retry-After gets the mapping's, one with its own keeps it, other statuses pass as
// they are; the body is kept.
func TestEPPImmediateResponseLocalReplyMapping(t *testing.T) {
	const errBody = `{"error":{"message":"no capacity","type":"server_error","param":null,"code":"unavailable"}}`
	for _, tc := range []struct {
		name           string
		status         envoytypev3.StatusCode
		kv             []string
		want           int
		wantRetryAfter string
	}{
		{name: "503 without Retry-After gets one", status: envoytypev3.StatusCode_ServiceUnavailable, want: http.StatusServiceUnavailable, wantRetryAfter: "1"},
		{name: "503 with the EPP's Retry-After keeps it", status: envoytypev3.StatusCode_ServiceUnavailable, kv: []string{"retry-after", "30"},
			want: http.StatusServiceUnavailable, wantRetryAfter: "30"},
		{name: "500 as the EPP sent it", status: envoytypev3.StatusCode_InternalServerError, want: http.StatusInternalServerError},
		{name: "429 as the EPP sent it", status: envoytypev3.StatusCode_TooManyRequests, kv: []string{"retry-after", "7"},
			want: http.StatusTooManyRequests, wantRetryAfter: "7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			epp := startFakeEPP(t, eppBehaviour{decide: func(*seenExchange) []*extprocv3.ProcessingResponse {
				return []*extprocv3.ProcessingResponse{immediate(tc.status, errBody, tc.kv...)}
			}})
			proxy, _ := startProxy(t, Config{EPPAddress: epp.addr, EPPFailureRetryAfter: time.Second})
			code, hdr, body := post(t, proxy.URL+"/v1/completions", `{"model":"m"}`)
			if code != tc.want || hdr.Get("Retry-After") != tc.wantRetryAfter || body != errBody {
				t.Errorf("got %d, Retry-After %q, body %q; want %d, %q and the EPP's body", code, hdr.Get("Retry-After"), body, tc.want, tc.wantRetryAfter)
			}
		})
	}
}

func TestEPPImmediateResponseOnResponseHeaders(t *testing.T) {
	b := startBackend(t, "b", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, "backend exploded")
	})
	epp := startFakeEPP(t, eppBehaviour{
		decide:                routeTo(b.addr(), nil),
		responseHeadersAnswer: immediate(envoytypev3.StatusCode_ServiceUnavailable, "replaced", "x-replaced", "1"),
	})
	proxy, rec := startProxy(t, Config{EPPAddress: epp.addr})
	code, hdr, body := post(t, proxy.URL+"/v1/completions", `{}`)
	if code != http.StatusServiceUnavailable || body != "replaced" || hdr.Get("X-Replaced") != "1" || hdr.Get("Content-Type") != "text/plain" {
		t.Fatalf("got %d %v %q, want the EPP's 503", code, hdr, body)
	}
	if s := epp.exchanges()[0]; s.responseHeaders[":status"] != "500" {
		t.Errorf("EPP saw :status %q", s.responseHeaders[":status"])
	}
	if outcomes, _, _ := rec.snapshot(1); !slices.Equal(outcomes, []Outcome{OutcomeImmediate}) {
		t.Errorf("outcomes %v", outcomes)
	}
}

func TestStreamingIsNotBuffered(t *testing.T) {
	for _, mode := range []string{"epp", "round-robin"} {
		t.Run(mode, func(t *testing.T) {
			release := make(chan struct{})
			b := startBackend(t, "b", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				rc := http.NewResponseController(w)
				_, _ = io.WriteString(w, "data: {\"choices\":[{\"text\":\"first\"}]}\n\n")
				_ = rc.Flush()
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				_, _ = io.WriteString(w, "data: {\"choices\":[{\"text\":\"last\"}]}\n\ndata: [DONE]\n\n")
			})
			cfg := Config{RoundRobin: true, Endpoints: []string{b.addr()}}
			if mode == "epp" {
				epp := startFakeEPP(t, eppBehaviour{decide: routeTo(b.addr(), nil)})
				cfg = Config{EPPAddress: epp.addr}
			}
			proxy, _ := startProxy(t, cfg)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, proxy.URL+"/v1/completions", strings.NewReader(`{"stream":true}`))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			first := make(chan string, 1)
			go func() {
				line, _ := br.ReadString('\n')
				first <- line
			}()
			select {
			case line := <-first:
				if !strings.Contains(line, "first") {
					t.Fatalf("first line %q", line)
				}
			case <-time.After(30 * time.Second):
				// Not a timing assertion: the backend holds its last chunk
				// until the first one is seen, so a buffering proxy never
				// delivers anything.
				close(release)
				t.Fatal("first chunk did not arrive while the backend held back the rest: the proxy buffers")
			}
			close(release)
			rest, err := io.ReadAll(br)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(rest), "last") || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
				t.Errorf("rest of stream %q", rest)
			}
		})
	}
}

func TestEPPStreamsResponseChunksAndTransforms(t *testing.T) {
	b := startBackend(t, "b", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range 3 {
			_, _ = fmt.Fprintf(w, "data: {\"model\":\"target\",\"n\":%d}\n\n", i)
			_ = rc.Flush()
		}
	})
	epp := startFakeEPP(t, eppBehaviour{
		decide:    routeTo(b.addr(), nil),
		transform: func(c []byte) []byte { return []byte(strings.ReplaceAll(string(c), `"target"`, `"client"`)) },
	})
	proxy, _ := startProxy(t, Config{EPPAddress: epp.addr})
	code, hdr, body := post(t, proxy.URL+"/v1/completions", `{"stream":true}`)
	if code != 200 || strings.Contains(body, "target") || strings.Count(body, `"client"`) != 3 {
		t.Fatalf("status %d body %q: want 3 rewritten events", code, body)
	}
	if hdr.Get("Content-Length") != "" {
		t.Errorf("Content-Length %q forwarded although the EPP may rewrite the body", hdr.Get("Content-Length"))
	}
	s := epp.exchanges()[0]
	if got := strings.Join(stringsOf(s.responseChunks), ""); strings.Count(got, "data:") != 3 {
		t.Errorf("EPP saw response body %q", got)
	}
}

func stringsOf(bs [][]byte) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = string(b)
	}
	return out
}

func TestEPPUnreachable(t *testing.T) {
	b := startBackend(t, "b", nil)
	dead := refusedAddr(t)
	t.Run("fail-closed", func(t *testing.T) {
		proxy, rec := startProxy(t, Config{EPPAddress: dead})
		code, _, body := post(t, proxy.URL+"/v1/completions", `{}`)
		if code != http.StatusInternalServerError {
			t.Fatalf("status %d body %q, want 500", code, body)
		}
		if e := decodeAPIError(t, body); e.Code != codeEPPUnavailable {
			t.Errorf("error code %q", e.Code)
		}
		outcomes, _, failures := rec.snapshot(1)
		if !slices.Equal(outcomes, []Outcome{OutcomeEPPError}) || !slices.Equal(failures, []EPPFailure{EPPFailureRequest}) {
			t.Errorf("outcomes %v failures %v", outcomes, failures)
		}
	})
	t.Run("fail-closed, mapped to 503 with Retry-After", func(t *testing.T) {
		proxy, rec := startProxy(t, Config{EPPAddress: dead, EPPFailureRetryAfter: 1500 * time.Millisecond})
		code, hdr, body := post(t, proxy.URL+"/v1/completions", `{}`)
		if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") != "2" {
			t.Fatalf("status %d, Retry-After %q, body %q; want 503 with Retry-After 2 (whole seconds, rounded up)", code, hdr.Get("Retry-After"), body)
		}
		if e := decodeAPIError(t, body); e.Code != codeEPPUnavailable {
			t.Errorf("error code %q", e.Code)
		}
		outcomes, _, failures := rec.snapshot(1)
		if !slices.Equal(outcomes, []Outcome{OutcomeEPPError}) || !slices.Equal(failures, []EPPFailure{EPPFailureRequest}) {
			t.Errorf("outcomes %v failures %v", outcomes, failures)
		}
	})
	t.Run("fail-open", func(t *testing.T) {
		proxy, rec := startProxy(t, Config{EPPAddress: dead, FailureModeAllow: true, Endpoints: []string{b.addr()}})
		code, _, body := post(t, proxy.URL+"/v1/completions", `{}`)
		if code != 200 || !strings.Contains(body, `"backend":"b"`) {
			t.Fatalf("status %d body %q, want backend b", code, body)
		}
		outcomes, failedOpen, _ := rec.snapshot(1)
		if !slices.Equal(outcomes, []Outcome{OutcomeProxied}) || !slices.Equal(failedOpen, []bool{true}) {
			t.Errorf("outcomes %v failedOpen %v", outcomes, failedOpen)
		}
	})
}

func TestEPPErrorsDuringRequest(t *testing.T) {
	b := startBackend(t, "b", nil)
	epp := startFakeEPP(t, eppBehaviour{failRequest: status.Error(codes.Internal, "boom")})
	t.Run("fail-closed", func(t *testing.T) {
		proxy, _ := startProxy(t, Config{EPPAddress: epp.addr})
		code, _, body := post(t, proxy.URL+"/v1/completions", `{"model":"m"}`)
		if code != http.StatusInternalServerError || !strings.Contains(decodeAPIError(t, body).Message, "boom") {
			t.Fatalf("status %d body %q", code, body)
		}
	})
	t.Run("fail-open", func(t *testing.T) {
		proxy, _ := startProxy(t, Config{EPPAddress: epp.addr, FailureModeAllow: true, Endpoints: []string{b.addr()}})
		code, _, body := post(t, proxy.URL+"/v1/completions", `{"model":"m"}`)
		if code != 200 {
			t.Fatalf("status %d body %q", code, body)
		}
		if _, bodies, _ := b.received(); bodies[len(bodies)-1] != `{"model":"m"}` {
			t.Errorf("fail-open sent %q, want the original body", bodies[len(bodies)-1])
		}
	})
}

func TestEPPMessageTimeout(t *testing.T) {
	epp := startFakeEPP(t, eppBehaviour{stallRequest: true})
	proxy, rec := startProxy(t, Config{EPPAddress: epp.addr, MessageTimeout: 50 * time.Millisecond})
	code, _, body := post(t, proxy.URL+"/v1/completions", `{}`)
	if code != http.StatusGatewayTimeout || decodeAPIError(t, body).Code != codeEPPTimeout {
		t.Fatalf("status %d body %q, want 504", code, body)
	}
	if _, _, failures := rec.snapshot(1); !slices.Equal(failures, []EPPFailure{EPPFailureTimeout}) {
		t.Errorf("failures %v", failures)
	}
}

func TestEPPFailsOnResponseHeaders(t *testing.T) {
	const sse = "data: one\n\ndata: two\n\n"
	b := startBackend(t, "b", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, sse)
	})
	epp := startFakeEPP(t, eppBehaviour{decide: routeTo(b.addr(), nil), failResponseHeaders: status.Error(codes.Internal, "resp boom")})
	for _, tc := range []struct {
		name           string
		retryAfter     time.Duration
		want           int
		wantRetryAfter string
	}{
		{name: "fail-closed", want: http.StatusInternalServerError},
		{name: "fail-closed, 503 with Retry-After", retryAfter: time.Second, want: http.StatusServiceUnavailable, wantRetryAfter: "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxy, rec := startProxy(t, Config{EPPAddress: epp.addr, EPPFailureRetryAfter: tc.retryAfter})
			code, hdr, body := post(t, proxy.URL+"/v1/completions", `{}`)
			if code != tc.want || hdr.Get("Retry-After") != tc.wantRetryAfter {
				t.Fatalf("status %d, Retry-After %q, body %q; want %d with %q", code, hdr.Get("Retry-After"), body, tc.want, tc.wantRetryAfter)
			}
			decodeAPIError(t, body)
			if _, _, failures := rec.snapshot(1); !slices.Equal(failures, []EPPFailure{EPPFailureResponse}) {
				t.Errorf("failures %v", failures)
			}
		})
	}
	t.Run("fail-open replays the upstream response", func(t *testing.T) {
		proxy, rec := startProxy(t, Config{EPPAddress: epp.addr, FailureModeAllow: true, Endpoints: []string{b.addr()}})
		code, hdr, body := post(t, proxy.URL+"/v1/completions", `{}`)
		if code != 200 || body != sse || hdr.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("got %d %q %v, want the upstream response unchanged", code, body, hdr)
		}
		if _, failedOpen, _ := rec.snapshot(1); !slices.Equal(failedOpen, []bool{true}) {
			t.Errorf("failedOpen %v", failedOpen)
		}
	})
}

func TestNoEndpointPicked(t *testing.T) {
	epp := startFakeEPP(t, eppBehaviour{decide: func(s *seenExchange) []*extprocv3.ProcessingResponse {
		return append([]*extprocv3.ProcessingResponse{headersResponse(nil)}, bodyResponses(s.requestBody)...)
	}})
	// The gateway's own 503: with the local reply mapping (EPPFailureRetryAfter) it carries a Retry-After.
	for _, tc := range []struct {
		retryAfter     time.Duration
		wantRetryAfter string
	}{{}, {retryAfter: 2 * time.Second, wantRetryAfter: "2"}} {
		proxy, rec := startProxy(t, Config{EPPAddress: epp.addr, EPPFailureRetryAfter: tc.retryAfter})
		code, hdr, body := post(t, proxy.URL+"/v1/completions", `{}`)
		if code != http.StatusServiceUnavailable || decodeAPIError(t, body).Code != codeNoEndpoint || hdr.Get("Retry-After") != tc.wantRetryAfter {
			t.Fatalf("status %d, Retry-After %q, body %q; want 503 no_endpoint with Retry-After %q", code, hdr.Get("Retry-After"), body, tc.wantRetryAfter)
		}
		if outcomes, _, _ := rec.snapshot(1); !slices.Equal(outcomes, []Outcome{OutcomeNoEndpoint}) {
			t.Errorf("outcomes %v", outcomes)
		}
	}
}

func TestAllEndpointsRefuse(t *testing.T) {
	epp := startFakeEPP(t, eppBehaviour{decide: routeTo(refusedAddr(t)+","+refusedAddr(t), nil)})
	proxy, _ := startProxy(t, Config{EPPAddress: epp.addr})
	code, _, body := post(t, proxy.URL+"/v1/completions", `{}`)
	if code != http.StatusBadGateway || decodeAPIError(t, body).Code != codeUpstreamConnect {
		t.Fatalf("status %d body %q, want 502", code, body)
	}
}

func TestNonLoopbackDestinationRefused(t *testing.T) {
	// 192.0.2.0/24 is TEST-NET-1: never dialled because the check comes first.
	epp := startFakeEPP(t, eppBehaviour{decide: routeTo("192.0.2.1:8000", nil)})
	proxy, _ := startProxy(t, Config{EPPAddress: epp.addr})
	code, _, body := post(t, proxy.URL+"/v1/completions", `{}`)
	if code != http.StatusBadGateway || decodeAPIError(t, body).Code != codeUpstreamNotAllowed {
		t.Fatalf("status %d body %q, want 502 upstream_not_allowed", code, body)
	}
}

func TestSubsetHint(t *testing.T) {
	b := startBackend(t, "b", nil)
	epp := startFakeEPP(t, eppBehaviour{decide: routeTo(b.addr(), nil)})
	subsetOf := func(s *seenExchange) any {
		ns, ok := s.requestMetadata["envoy.lb.subset_hint"].(map[string]any)
		if !ok {
			return nil
		}
		return ns["x-gateway-destination-endpoint-subset"]
	}
	t.Run("configured", func(t *testing.T) {
		proxy, _ := startProxy(t, Config{EPPAddress: epp.addr, SubsetHint: []string{"127.0.0.1:1", "127.0.0.1:2"}})
		post(t, proxy.URL+"/v1/completions", `{}`)
		ex := epp.exchanges()
		got := subsetOf(ex[len(ex)-1])
		if fmt.Sprint(got) != "[127.0.0.1:1 127.0.0.1:2]" {
			t.Errorf("subset %v", got)
		}
	})
	t.Run("from header", func(t *testing.T) {
		proxy, _ := startProxy(t, Config{EPPAddress: epp.addr, SubsetHintFromHeader: true})
		post(t, proxy.URL+"/v1/completions", `{}`, "x-gateway-destination-endpoint-subset", "127.0.0.1:3, 127.0.0.1:4")
		ex := epp.exchanges()
		last := ex[len(ex)-1]
		if got := subsetOf(last); fmt.Sprint(got) != "[127.0.0.1:3 127.0.0.1:4]" {
			t.Errorf("subset %v", got)
		}
		if _, ok := last.requestHeaders["x-gateway-destination-endpoint-subset"]; ok {
			t.Errorf("subset header was forwarded to the EPP")
		}
	})
	t.Run("absent", func(t *testing.T) {
		proxy, _ := startProxy(t, Config{EPPAddress: epp.addr, SubsetHintFromHeader: true})
		post(t, proxy.URL+"/v1/completions", `{}`)
		ex := epp.exchanges()
		if got := subsetOf(ex[len(ex)-1]); got != nil {
			t.Errorf("subset %v sent without a hint", got)
		}
	})
}

func TestGETWithoutBodyEndsStreamOnHeaders(t *testing.T) {
	b := startBackend(t, "b", nil)
	epp := startFakeEPP(t, eppBehaviour{decide: routeTo(b.addr(), nil)})
	proxy, _ := startProxy(t, Config{EPPAddress: epp.addr})
	resp, err := http.Get(proxy.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"backend":"b"`) {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if s := epp.exchanges()[0]; !s.headersEOS || len(s.requestBody) != 0 {
		t.Errorf("headersEOS=%v body=%q, want end_of_stream on the headers", s.headersEOS, s.requestBody)
	}
}

func TestRoundRobin(t *testing.T) {
	a := startBackend(t, "a", nil)
	b := startBackend(t, "b", nil)
	dead := refusedAddr(t)
	proxy, rec := startProxy(t, Config{RoundRobin: true, Endpoints: []string{a.addr(), dead, b.addr()}, ReportServedHeader: true})
	var served []string
	for range 6 {
		code, hdr, body := post(t, proxy.URL+"/v1/completions", `{}`)
		if code != 200 {
			t.Fatalf("status %d body %q", code, body)
		}
		served = append(served, hdr.Get("X-Gateway-Destination-Endpoint-Served"))
		if v := hdr.Get(EPPTimeHeader); v != "" {
			t.Errorf("%s %q without an EPP", EPPTimeHeader, v)
		}
	}
	// Rotation a, dead->b, b, a, dead->b, b.
	want := []string{a.addr(), b.addr(), b.addr(), a.addr(), b.addr(), b.addr()}
	if !slices.Equal(served, want) {
		t.Errorf("served %v, want %v", served, want)
	}
	if outcomes, _, _ := rec.snapshot(6); len(outcomes) != 6 {
		t.Errorf("%d outcomes for 6 requests", len(outcomes))
	}
}

func TestBodyTooLarge(t *testing.T) {
	b := startBackend(t, "b", nil)
	proxy, rec := startProxy(t, Config{RoundRobin: true, Endpoints: []string{b.addr()}, MaxRequestBodyBytes: 8})
	code, _, body := post(t, proxy.URL+"/v1/completions", `{"model":"toolong"}`)
	if code != http.StatusRequestEntityTooLarge || decodeAPIError(t, body).Code != codeBodyTooLarge {
		t.Fatalf("status %d body %q", code, body)
	}
	if outcomes, _, _ := rec.snapshot(1); !slices.Equal(outcomes, []Outcome{OutcomeBadRequest}) {
		t.Errorf("outcomes %v", outcomes)
	}
}

func TestUpstreamDiesMidStreamAborts(t *testing.T) {
	b := startBackend(t, "b", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: one\n\n")
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	})
	for _, mode := range []string{"epp", "round-robin"} {
		t.Run(mode, func(t *testing.T) {
			cfg := Config{RoundRobin: true, Endpoints: []string{b.addr()}}
			if mode == "epp" {
				epp := startFakeEPP(t, eppBehaviour{decide: routeTo(b.addr(), nil)})
				cfg = Config{EPPAddress: epp.addr}
			}
			proxy, rec := startProxy(t, cfg)
			// Depending on whether the upstream fails before or after the
			// response headers reach the client, the answer is a 502 or a
			// cut connection; never a complete 200.
			resp, err := http.Post(proxy.URL+"/v1/completions", "application/json", strings.NewReader(`{}`))
			var body []byte
			if err == nil {
				body, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			outcomes, _, _ := rec.snapshot(1)
			switch {
			case err != nil:
				if !slices.Equal(outcomes, []Outcome{OutcomeAborted}) {
					t.Errorf("connection cut but outcomes %v", outcomes)
				}
			case resp.StatusCode == http.StatusBadGateway:
				if decodeAPIError(t, string(body)).Code != codeUpstreamFailed || !slices.Equal(outcomes, []Outcome{OutcomeUpstreamError}) {
					t.Errorf("502 body %q outcomes %v", body, outcomes)
				}
			default:
				t.Errorf("client saw %d %q although the upstream died mid-stream", resp.StatusCode, body)
			}
		})
	}
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"neither mode", Config{}, "round-robin mode"},
		{"both modes", Config{RoundRobin: true, EPPAddress: "127.0.0.1:9002", Endpoints: []string{"127.0.0.1:1"}}, "mutually exclusive"},
		{"rr without endpoints", Config{RoundRobin: true}, "at least one endpoint"},
		{"fail-open without endpoints", Config{EPPAddress: "127.0.0.1:9002", FailureModeAllow: true}, "failure-mode-allow"},
		{"bad endpoint", Config{RoundRobin: true, Endpoints: []string{"nope"}}, "not host:port"},
		{"bad port", Config{RoundRobin: true, Endpoints: []string{"127.0.0.1:0"}}, "invalid port"},
		{"remote endpoint", Config{RoundRobin: true, Endpoints: []string{"10.0.0.1:80"}}, "not a loopback"},
		{"subset in rr", Config{RoundRobin: true, Endpoints: []string{"127.0.0.1:1"}, SubsetHint: []string{"127.0.0.1:1"}}, "subset hint"},
		{"bad epp", Config{EPPAddress: "epp"}, "EPP address"},
		{"ok rr", Config{RoundRobin: true, Endpoints: []string{"localhost:8000", "[::1]:8001"}}, ""},
		{"ok remote allowed", Config{RoundRobin: true, Endpoints: []string{"10.0.0.1:80"}, AllowNonLoopbackUpstreams: true}, ""},
		{"ok epp", Config{EPPAddress: "127.0.0.1:9002"}, ""},
		{"replicas without epp", Config{RoundRobin: true, Endpoints: []string{"127.0.0.1:1"}, EPPReplicas: []string{"127.0.0.1:9003"}}, "need an EPP address"},
		{"bad replica", Config{EPPAddress: "127.0.0.1:9002", EPPReplicas: []string{"epp"}}, "EPP replica"},
		{"bad balance", Config{EPPAddress: "127.0.0.1:9002", EPPBalance: "least-request"}, `EPP balance "least-request"`},
		{"ok replicas", Config{EPPAddress: "127.0.0.1:9002", EPPReplicas: []string{"127.0.0.1:9003"}, EPPBalance: BalanceRandom}, ""},
		{"bad body mode", Config{EPPAddress: "127.0.0.1:9002", RequestBodyMode: "streamed"}, `request body mode "streamed"`},
		{"ok buffered", Config{EPPAddress: "127.0.0.1:9002", RequestBodyMode: BodyBuffered}, ""},
		{"negative EPP failure Retry-After", Config{EPPAddress: "127.0.0.1:9002", EPPFailureRetryAfter: -time.Second}, "is negative"},
		{"ok EPP failure Retry-After", Config{EPPAddress: "127.0.0.1:9002", EPPFailureRetryAfter: time.Second}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New accepted an invalid config")
	}
}

func TestIsConnectError(t *testing.T) {
	p, err := New(Config{RoundRobin: true, Endpoints: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	req, _ := http.NewRequest(http.MethodGet, "http://"+refusedAddr(t)+"/", nil)
	_, err = p.transport.RoundTrip(req)
	if !isConnectError(err) {
		t.Errorf("refused connection %v not classified as a connect error", err)
	}
	if isConnectError(errors.New("read: connection reset")) {
		t.Error("plain error classified as connect error")
	}
}
