// Package runner composes the Sluice Endpoint Picker (EPP) from the exported
// pieces of the Gateway API Inference Extension (GIE) v1.5.0.
//
// Upstream's cmd/epp/runner cannot inject an admission controller, a Director
// or gRPC server options, and it never shapes the immediate responses it sends
// to the proxy. This package rebuilds the same process from upstream's
// exported packages (server.Options, NewDefaultManager, the ExtProcServerRunner
// reconcilers, handlers.NewStreamingServer, requestcontrol.NewDirectorWithConfig,
// config/loader) and owns the gRPC servers, which gives Sluice its seams:
//
//   - AdmissionFactory: builds the requestcontrol.AdmissionController the
//     Director consults for every request (default: upstream's choice, legacy
//     saturation admission or the experimental flow controller).
//   - ResponseShaper: adjusts every immediate response (rejections and errors)
//     before it reaches the proxy, e.g. to add Retry-After headers and an
//     OpenAI-style JSON error body.
//   - ModelSelector (WithModelSelector): chooses each request's model before
//     upstream parses it. The ext_proc stream holds the request headers until
//     the body is complete (upstream answers nothing before that either; at
//     most --model-selection-max-body-bytes are held, larger bodies get 413),
//     then sets upstream's x-gateway-model-name-rewrite header. Upstream thus
//     schedules (LoRA affinity, prefix hashing) for the chosen model, sends it
//     in the body, and rewrites the response's "model" back to the client's,
//     streaming included. Upstream's own random InferenceModelRewrite split is
//     switched off. The selector hears how each request ended (status, time to
//     first body byte, completeness) when its stream ends.
//   - WithFlags: lets the binary add its own flags (e.g. Sluice admission's)
//     and adjust the parsed options before they are validated.
//   - WithHotPath: upstream's handler and Director less the per-chunk work
//     whose result nothing reads: response-body plugins run only on the
//     chunks they act on, and response body messages lose the filter metadata
//     upstream would convert unread (hotpath.go). With Sluice's parser, once
//     upstream's handler has streamed a response's first chunk, the stream
//     answers the later chunks that carry no usage itself, as upstream's
//     handler would answer them (upstream's handler sees the first and the
//     last, and every chunk at -v=4 and up). cmd/epp takes it with Sluice
//     admission.
//   - A request body the proxy sends BUFFERED (an opt-in of the proxy's
//     ext_proc request_body_mode, read from the protocol_config of the
//     stream's first message; bufferedbody.go): the stream answers the
//     request headers at once and answers the body with one BodyResponse
//     carrying upstream's routing headers and metadata, and the body only
//     when it changed. With GIE's FULL_DUPLEX_STREAMED nothing changes.
//   - The response observer (--response-observer-wait, an opt-in of the
//     proxy; responseobserver.go): a routing stream whose protocol_config
//     says the response body is NONE takes its response from a second
//     stream in Envoy's observability mode, joined by request.id, which the
//     EPP never answers; the routing stream's end at the response headers
//     is not the request's. Off by default; one replica only.
//   - WithManagerSetup: in Kubernetes mode only, extends the controller
//     manager's options before it is created (scheme, cache ByObject) and the
//     manager after (extra controllers, e.g. the FlowControlPolicy reconciler).
//
// Two modes run the same request path:
//
//   - Kubernetes mode (--pool-name or --endpoint-selector), exactly upstream's
//     behaviour: a controller-runtime manager reconciles InferencePools, Pods,
//     InferenceObjectives and InferenceModelRewrites, with leader election and
//     an authenticated metrics endpoint available.
//   - Static mode (--static-endpoints / --static-endpoints-file), which upstream
//     lacks: no Kubernetes API at all; the listed host:port endpoints form the
//     pool and their metrics are scraped like pods'. A file is re-read while the
//     EPP runs, so endpoints can be added and removed without a restart.
//
// Every upstream v1.5.0 flag and environment variable keeps its name and
// default; Sluice adds its own flags beside them.
package runner
