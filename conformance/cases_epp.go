package conformance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// The endpoint picker protocol (proposal 004) on a pool of three idle,
// Ready model servers, with the implementation's default configuration.

// largeBodyBytes exceeds the largest request body an EPP is expected to hold
// (Sluice's --model-selection-max-body-bytes default, 64 MiB): valid JSON
// padded with whitespace, so an EPP without a limit still parses it cheaply.
const largeBodyBytes = 64<<20 + 1

var endpointPickerGroup = Group{
	Name:    "EndpointPicker",
	Fixture: &FixtureSpec{Pods: 3},
	Cases: []Case{
		{
			Name: "DestinationHeader", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 50, Quote: "Setting the `x-gateway-destination-endpoint` HTTP header"},
			Requirement: "Every routed request names its endpoint in the x-gateway-destination-endpoint header, a Ready pool member.",
			Run: func(t *T, f *Fixture) {
				for range 10 {
					d := f.exchange(t, Request{Body: Chat(uniquePrompt())})
					if d.Immediate != nil {
						t.Fatalf("immediate response %d: %s", d.Immediate.Status, d.Immediate.Body)
					}
					eps := splitEndpoints(d.Destination())
					if d.Destination() == "" || !slices.Contains(f.AllAddrs(), eps[0]) {
						t.Fatalf("x-gateway-destination-endpoint = %q, want one of %v", d.Destination(), f.AllAddrs())
					}
				}
				t.Observe("header", "set")
			},
		},
		{
			Name: "DestinationMetadata", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 58, Quote: `"x-gateway-destination-endpoint": <ip:port>`},
			Requirement: "Every routed request names its endpoint in dynamic metadata envoy.lb/x-gateway-destination-endpoint.",
			Run: func(t *T, f *Fixture) {
				for range 10 {
					d := f.exchange(t, Request{Body: Chat(uniquePrompt())})
					if d.Immediate != nil {
						t.Fatalf("immediate response %d: %s", d.Immediate.Status, d.Immediate.Body)
					}
					if eps := splitEndpoints(d.MetadataDestination()); !slices.Contains(f.AllAddrs(), eps[0]) {
						t.Fatalf("envoy.lb/x-gateway-destination-endpoint = %q, want one of %v (metadata: %v)", d.MetadataDestination(), f.AllAddrs(), d.Metadata)
					}
				}
				t.Observe("metadata", "set")
			},
		},
		{
			Name: "HeaderAgreesWithMetadata", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 77, Quote: "The EPP MUST not set two different values in the header and the inner response metadata value."},
			Requirement: "The header and the envoy.lb metadata carry the same value.",
			Run: func(t *T, f *Fixture) {
				f.routeCounts(t, 10, nil) // route fails the case on any disagreement
				t.Observe("agree", "true")
			},
		},
		{
			Name: "EndpointFormat", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 71, Quote: "in `<ip:port>` format or multiple endpoints in `<ip:port>,<ip:port>,...` format"},
			Requirement: "The destination is one <ip:port>, or several separated by commas, each a pool endpoint.",
			Run: func(t *T, f *Fixture) {
				counts := map[int]int{}
				for range 10 {
					eps := f.route(t, Request{Body: Chat(uniquePrompt())})
					counts[len(eps)]++
					for _, ep := range eps {
						if !validEndpoint(ep) || !slices.Contains(f.AllAddrs(), ep) {
							t.Errorf("endpoint %q is not an <ip:port> of the pool %v", ep, f.AllAddrs())
						}
					}
				}
				t.Observe("endpoints-per-answer", "%v", slices.Sorted(maps.Keys(counts)))
			},
		},
		{
			Name: "RequestWithoutBody", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 48, Quote: "For each HTTP request, the EPP MUST communicate to the data plane one or more selected model server endpoints"},
			Requirement: "A request without a body (GET /v1/models, headers with end_of_stream) is routed too.",
			Run: func(t *T, f *Fixture) {
				eps := f.route(t, Request{Method: "GET", Path: "/v1/models"})
				if !slices.Contains(f.AllAddrs(), eps[0]) {
					t.Errorf("routed to %v, want a pool endpoint", eps)
				}
				t.Observe("routed", "true")
			},
		},
		{
			Name: "SubsetHintHonoured", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 40, Quote: "the EPP MUST only select endpoints from the specified list"},
			Requirement: "With envoy.lb.subset_hint set, every choice is in the subset.",
			Run: func(t *T, f *Fixture) {
				a, b, c := f.Addrs(0)[0], f.Addrs(1)[0], f.Addrs(2)[0]
				onlyIn(t, f.routeCounts(t, 10, []string{b}), b)
				onlyIn(t, f.routeCounts(t, 10, []string{a, c}), a, c)
				t.Observe("subset", "honoured")
			},
		},
		{
			Name: "SubsetHintEmpty", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 40, Quote: "or the list is empty, then the EPP MUST return a"},
			Requirement: "An empty subset hint gets an immediate 503.",
			Run: func(t *T, f *Fixture) {
				f.requireImmediate(t, Request{Body: Chat(uniquePrompt()), Subset: []string{}}, 503)
			},
		},
		{
			Name: "SubsetHintNoPoolMember", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 40, Quote: "If none of the endpoints in the list is eligible"},
			Requirement: "A subset naming no pool endpoint gets an immediate 503.",
			Run: func(t *T, f *Fixture) {
				f.requireImmediate(t, Request{Body: Chat(uniquePrompt()), Subset: []string{"10.255.255.1:8000"}}, 503)
			},
		},
		{
			Name: "NoSubsetHintUsesWholePool", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 42, Quote: "then the EPP MUST select from the set defined by the `InferencePool` selector"},
			Requirement: "Without a subset hint, requests reach every member of the pool.",
			Run: func(t *T, f *Fixture) {
				seen := map[string]int{}
				for i := 0; i < 90 && len(seen) < len(f.AllAddrs()); i++ {
					for k, v := range f.routeCounts(t, 1, nil) {
						seen[k] += v
					}
				}
				onlyIn(t, seen, f.AllAddrs()...)
				if len(seen) != len(f.AllAddrs()) {
					t.Errorf("in 90 requests only %v were chosen, want all of %v", seen, f.AllAddrs())
				}
				t.Observe("members-used", "all")
			},
		},
		{
			Name: "BodyMutationContentLength", Profile: EPPProfile,
			Ref:         Ref{Path: "pkg/epp/handlers/request.go", Line: 113, Quote: "We need to update the content length header if the body is mutated"},
			Requirement: "When the EPP rewrites the body, content-length matches the new body (or is removed), and the body is the same request.",
			Run: func(t *T, f *Fixture) {
				body := []byte(`{ "model" : "` + Model + `", "messages": [ {"role": "user", "content": "` + uniquePrompt() + `"} ], "max_tokens": 8 }`)
				d := f.exchange(t, Request{Body: body})
				if d.Immediate != nil {
					t.Fatalf("immediate response %d: %s", d.Immediate.Status, d.Immediate.Body)
				}
				checkContentLength(t, d, body)
				var orig, fwd map[string]any
				_ = json.Unmarshal(body, &orig)
				if err := json.Unmarshal(d.Body, &fwd); err != nil {
					t.Fatalf("forwarded body is not JSON: %v: %q", err, d.Body)
				}
				if fmt.Sprint(fwd) != fmt.Sprint(orig) {
					t.Errorf("forwarded body %s, want the same request as %s", d.Body, body)
				}
				t.Observe("body", "%s", map[bool]string{true: "rewritten", false: "unchanged"}[d.BodyMutated && !bytes.Equal(d.Body, body)])
			},
		},
		{
			Name: "ResponseStreamedInOrder", Profile: EPPProfile,
			Ref:         Ref{Path: "pkg/epp/handlers/server.go", Line: 286, Quote: "For streaming response, we send response chunk back to envoy every time we received it."},
			Requirement: "A streamed (SSE) response comes back complete, in order, ending with end_of_stream, with served-endpoint metadata on every message.",
			Run: func(t *T, f *Fixture) {
				served := f.Addrs(1)[0]
				var chunks [][]byte
				var want []byte
				for i := range 8 {
					c := fmt.Appendf(nil, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", Model, i)
					chunks = append(chunks, c)
					want = append(want, c...)
				}
				chunks = append(chunks, []byte("data: [DONE]\n\n"))
				want = append(want, "data: [DONE]\n\n"...)
				d := f.exchange(t, Request{Body: ChatFor(Model, uniquePrompt(), true), Subset: []string{served}, Response: &Reply{
					Headers: map[string]string{"content-type": "text/event-stream"}, Chunks: chunks, Served: served,
				}})
				if d.Immediate != nil {
					t.Fatalf("immediate response %d: %s", d.Immediate.Status, d.Immediate.Body)
				}
				if !bytes.Equal(d.ResponseBody, want) {
					t.Errorf("client receives %q, want %q", d.ResponseBody, want)
				}
				t.Observe("stream", "complete")
			},
		},
		{
			Name: "ResponseServedElsewhere", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 95, Quote: "will attempt each endpoint in order until the request is successful"},
			Requirement: "A response served by another endpoint than the first named (a fallback) is processed normally.",
			Run: func(t *T, f *Fixture) {
				first, other := f.Addrs(0)[0], f.Addrs(2)[0]
				d := f.exchange(t, Request{Body: Chat(uniquePrompt()), Subset: []string{first}, Response: func() *Reply {
					r := ChatCompletionReply(Model)
					r.Served = other
					return r
				}()})
				if d.Immediate != nil {
					t.Fatalf("immediate response %d: %s", d.Immediate.Status, d.Immediate.Body)
				}
				var resp map[string]any
				if err := json.Unmarshal(d.ResponseBody, &resp); err != nil || resp["model"] != Model {
					t.Errorf("client receives %q, want the model server's answer", d.ResponseBody)
				}
				t.Observe("response", "passed")
			},
		},
		openAIAPIsCase,
		{
			Name: "MalformedJSON", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 74, Quote: "If the EPP did not communicate the server endpoint via these two methods, it MUST return an error"},
			Requirement: "A body that is not JSON gets an immediate 4xx error (400), never a broken stream.",
			Run: func(t *T, f *Fixture) {
				f.requireImmediate(t, Request{Body: []byte(`{"model": "` + Model + `", "messages": [`)}, 400)
			},
		},
		{
			Name: "ModelMissing", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 74, Quote: "If the EPP did not communicate the server endpoint via these two methods, it MUST return an error"},
			Requirement: "A completion request without a model gets an immediate 400.",
			Run: func(t *T, f *Fixture) {
				f.requireImmediate(t, Request{Body: []byte(`{"messages":[{"role":"user","content":"hi"}]}`)}, 400)
			},
		},
		{
			Name: "BodyOverLimit", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 74, Quote: "If the EPP did not communicate the server endpoint via these two methods, it MUST return an error"},
			Requirement: "A body over the EPP's limit (64 MiB) gets an immediate 413; an EPP without a limit routes it. Either way the stream ends in one answer.",
			Run: func(t *T, f *Fixture) {
				prefix := Chat(uniquePrompt())
				body := append(prefix, bytes.Repeat([]byte(" "), largeBodyBytes-len(prefix))...)
				d := f.exchange(t, Request{Body: body})
				if d.Immediate == nil {
					checkContentLength(t, d, body)
					t.Observe("outcome", "routed")
					return
				}
				observeImmediate(t, d.Immediate)
				if d.Immediate.Status != 413 {
					t.Errorf("immediate response %d, want 413: %s", d.Immediate.Status, d.Immediate.Body)
				}
				t.Observe("outcome", "rejected")
			},
		},
	},
}

// checkContentLength requires, when the EPP rewrote the body, that its
// header mutation sets content-length to the new length or removes it.
func checkContentLength(t *T, d *Decision, sent []byte) {
	t.Helper()
	if !d.BodyMutated || len(d.Body) == len(sent) {
		if cl, ok := d.SetHeaders["content-length"]; ok && cl != strconv.Itoa(len(d.Body)) {
			t.Errorf("content-length set to %s, body is %d bytes", cl, len(d.Body))
		}
		return
	}
	cl, set := d.SetHeaders["content-length"]
	removed := slices.ContainsFunc(d.RemovedHeaders, func(h string) bool { return strings.EqualFold(h, "content-length") })
	switch {
	case set && cl != strconv.Itoa(len(d.Body)):
		t.Errorf("body rewritten to %d bytes but content-length set to %s", len(d.Body), cl)
	case !set && !removed:
		t.Errorf("body rewritten from %d to %d bytes but content-length neither set nor removed", len(sent), len(d.Body))
	}
}
