package dataplane

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// TestResponseObserver: with ResponseObserver the proxy behaves as Envoy with
// examples/envoy/envoy-response-observer.yaml: the routing stream announces response_body_mode NONE and carries only
// the request phase; a second stream, every message of it in observability mode, carries the response headers (with
// the request.id attribute, the x-request-id the routing stream saw) and the body up to its end; the client gets the
// upstream's response unchanged.
func TestResponseObserver(t *testing.T) {
	const answer = "data: {\"choices\":[]}\n\ndata: [DONE]\n\n"
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    string
	}{
		{name: "a streamed response", want: answer, handler: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, part := range strings.SplitAfter(answer, "\n\n") {
				_, _ = w.Write([]byte(part))
				w.(http.Flusher).Flush()
			}
		}},
		{name: "no body", want: "", handler: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", "0")
			w.WriteHeader(http.StatusOK)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			backend := startBackend(t, "b", tc.handler)
			epp := startFakeEPP(t, eppBehaviour{decide: routeTo(backend.addr(), nil)})
			proxy, rec := startProxy(t, Config{EPPAddress: epp.addr, ResponseObserver: true})
			code, _, body := post(t, proxy.URL+"/v1/chat/completions", `{"model":"m","stream":true}`)
			if code != http.StatusOK || body != tc.want {
				t.Fatalf("status %d, body %q; want 200, %q", code, body, tc.want)
			}
			rec.snapshot(1)                // the exchange is over
			ex := epp.endedExchanges(t, 2) // the observer's stream may end after the client has its answer
			if len(ex) != 2 {
				t.Fatalf("the EPP saw %d streams, want the routing stream and the observer's", len(ex))
			}
			routing, observer := ex[0], ex[1]
			if routing.protocolConfig.GetResponseBodyMode() != filterv3.ProcessingMode_NONE || routing.observed ||
				routing.responseHeaders != nil || len(routing.responseChunks) != 0 {
				t.Errorf("routing stream: protocol config %v, observed %v, response headers %v, %d chunks; want response NONE and no response",
					routing.protocolConfig, routing.observed, routing.responseHeaders, len(routing.responseChunks))
			}
			if !observer.observed || observer.notObserved || observer.requestHeaders != nil || observer.protocolConfig != nil {
				t.Errorf("observer stream: every message observed %v (a message not %v), request headers %v, protocol config %v",
					observer.observed, observer.notObserved, observer.requestHeaders, observer.protocolConfig)
			}
			if id := routing.requestHeaders["x-request-id"]; id == "" || observer.observedID != id {
				t.Errorf("observer's request.id %q, the routing stream's x-request-id %q", observer.observedID, id)
			}
			if got := string(bytes.Join(observer.responseChunks, nil)); got != tc.want || !observer.responseEnd ||
				observer.responseHeaders[":status"] != "200" {
				t.Errorf("observer saw status %q, body %q, end %v; want 200, %q, the end", observer.responseHeaders[":status"], got,
					observer.responseEnd, tc.want)
			}
		})
	}
}
