// Package dataplane is a small HTTP reverse proxy that plays the part Envoy
// plays in production: it asks an Endpoint Picker (EPP) over Envoy's external
// processing protocol (ext_proc, envoy.service.ext_proc.v3) where each request
// goes, and forwards it there. It exists so that Sluice's EPP can be tested
// and benchmarked end to end on a machine without Envoy.
//
// It is NOT a general-purpose proxy and not for production: production
// deployments use Envoy (or another Gateway API implementation) configured as
// in examples/envoy. Only what the GIE v1.5.0 reference configuration uses
// is implemented.
//
// # Protocol (as Envoy with GIE's reference ext_proc settings)
//
// Processing mode: request and response headers SEND, request and response
// bodies FULL_DUPLEX_STREAMED, announced in ProtocolConfiguration on the first
// message. Per request, on one ext_proc stream:
//
//  1. Request headers (:method, :path, :authority, :scheme and the client's
//     headers in lower case, plus x-request-id, generated for every request
//     as Envoy does at the edge, x-forwarded-for and x-forwarded-proto) with end_of_stream set when
//     there is no body; then the body in chunks of at most 32 KiB, the last
//     with end_of_stream. The proxy reads the whole client body (bounded by
//     MaxRequestBodyBytes) before opening the stream, so the EPP sees the
//     same messages as from Envoy with a fast client.
//  2. The EPP answers the headers (a header mutation) and streams the body
//     back (the EPP may rewrite it, e.g. the model name), or sends an
//     ImmediateResponse, which goes to the client as is: status, headers and
//     body.
//  3. The request goes to the endpoints named in the
//     x-gateway-destination-endpoint header after mutation, or else in the
//     envoy.lb/x-gateway-destination-endpoint dynamic metadata: a comma
//     list tried in order, moving on only when a TCP connect fails.
//  4. Response headers (with :status) and then each upstream body read go to
//     the EPP as they arrive. Every message from here on carries
//     envoy.lb/x-gateway-destination-endpoint-served (the endpoint that
//     answered) in its metadata_context, which is where the EPP protocol and
//     GIE's destination-endpoint-served-verifier look for it.
//  5. The EPP's response header mutation is applied before the client sees
//     the headers; each streamed body chunk from the EPP is written and
//     flushed to the client at once, so SSE tokens are never held back.
//
// # BUFFERED request bodies (Config.RequestBodyMode, --request-body-mode)
//
// As Envoy with processing_mode.request_body_mode BUFFERED (request headers
// SEND; examples/envoy/envoy-buffered-request-body.yaml), announced in
// ProtocolConfiguration: the proxy sends the request headers and waits for
// their answer (a header mutation, or an ImmediateResponse, after which no
// body is sent), then sends the whole body in one message with end_of_stream
// and waits for its answer: a BodyResponse whose header mutation is applied
// (Envoy applies a body answer's header mutation only in this mode) and
// whose body mutation, if any, replaces (body) or clears (clear_body) the
// body; without one the client's body goes upstream unchanged. A
// streamed_response answer is a protocol error, as is a content-length
// header, after the mutations, that does not match the body forwarded
// (Envoy keeps content-length in this mode and rejects such a mutation).
// Responses stay FULL_DUPLEX_STREAMED.
//
// Every message carries the subset hint (envoy.lb.subset_hint /
// x-gateway-destination-endpoint-subset) when one is configured.
//
// Round-robin mode (Config.RoundRobin) skips the EPP and rotates over
// Config.Endpoints; it is the baseline that benchmarks compare against.
//
// # Invariants
//
//   - Every request gets exactly one answer: the upstream response, the EPP's
//     ImmediateResponse, or an OpenAI-style JSON error (413 body too large,
//     500 EPP failure in fail-closed mode, 504 EPP message timeout, 503 no
//     endpoint picked, 502 no endpoint reachable or upstream failure). A
//     failure after the response headers went out aborts the connection
//     (http.ErrAbortHandler) because no status can be sent any more.
//   - A request is sent to a second endpoint only if connecting to the first
//     failed, so it never runs twice.
//   - Fail-open (Config.FailureModeAllow, Envoy's failure_mode_allow, GIE's
//     FailOpen) sends the original, unmodified request to Config.Endpoints
//     round-robin when the EPP fails before the request was dispatched. When
//     the EPP fails on the response headers, the unmodified upstream response
//     is replayed, including the body chunks the EPP had already been given.
//     Once the client has the EPP's response headers, an EPP failure aborts.
//   - Upstream endpoints must be loopback addresses unless
//     Config.AllowNonLoopbackUpstreams is set; a disallowed endpoint named by
//     the EPP is skipped like an unreachable one.
//   - Clients cannot pick their destination: x-gateway-destination-endpoint
//     and x-gateway-destination-endpoint-served are removed from incoming
//     requests. Nor their x-request-id, which the EPP keys requests by: a
//     client's is replaced.
//
// # Concurrency
//
// A Proxy is safe for concurrent use. Each request runs in its handler
// goroutine; in the response phase two helper goroutines (one reading the
// upstream body, one sending it to the EPP) run alongside it, and the handler
// waits for both before it returns, so no goroutine outlives its request.
// Serve runs an http.Server until its context ends; Close releases the EPP
// connection.
package dataplane
