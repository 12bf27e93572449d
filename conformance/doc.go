// Package conformance is an EPP conformance profile for the Gateway API
// Inference Extension (GIE) v1.5.0: a black-box suite that runs any
// Endpoint Picker binary against a real API server (envtest) and simulated
// vLLM model servers (testbed/simulator), drives it exactly as Envoy does
// with GIE's recommended configuration (ext_proc, FULL_DUPLEX_STREAMED
// bodies, metadata in envoy.lb and envoy.lb.subset_hint), and checks what
// GIE's proposals 003 (model server protocol) and 004 (endpoint picker
// protocol) require, case by case, each case citing the line it checks.
//
// Upstream's own conformance module has only a Gateway profile (it tests
// gateways, with the EPP image fixed); its EPP and ModelServer profiles are
// "future". This package is those two profiles, for an EPP image.
//
// # Running it
//
//	make conformance                          # upstream v1.5.0, Sluice, Sluice with every feature on
//	make conformance EPP=/path/to/my-epp EPP_ARGS="--my-flag=1"
//	go test ./conformance -run TestEPPProfile -args -epp=/path/to/my-epp \
//	    [-epp-args="..."] [-epp-name=mine] [-reference-epp=bin/upstream-epp] [-report-dir=DIR]
//
// (go test needs KUBEBUILDER_ASSETS from `make envtest`; the make target
// sets it.) Without -epp the suite tests $SLUICE_UPSTREAM_EPP_BINARY and
// $SLUICE_EPP_BINARY (`make test` sets both); with neither it fails: it
// never passes having tested nothing.
//
// # What an EPP must accept
//
// The suite starts the binary as upstream's Deployment does, with
// upstream's flags: --pool-name, --pool-namespace, --grpc-port,
// --grpc-health-port, --metrics-port, --secure-serving=false,
// --metrics-endpoint-auth=false, --tracing=false,
// --refresh-metrics-interval=50ms, and per group --config-file (an
// EndpointPickerConfig of upstream plugin types) or
// --ha-enable-leader-election; KUBECONFIG points at the API server. Any EPP
// built on GIE's runner accepts these; another EPP can be wrapped in a
// script that maps them. Its gRPC health service answers on the health port
// and, for the leak checks, go_goroutines (or Go's pprof) on the metrics
// port.
//
// An immediate 503 with Retry-After (an admission controller's "not now")
// is retried once after that delay, at most 2s, as an HTTP client honouring
// it would; the retry is logged and its answer counts. Cases that check
// such an answer send without retrying.
//
// # Results
//
// Every case of every group runs against every implementation, one
// implementation after the other. A case reports failures and observations:
// deterministic descriptions of what the implementation did (a status, a
// body's kind, a header's presence). The differential compares each
// implementation's observations with the reference's (upstream's EPP);
// for Sluice every divergence must be an intended difference listed in
// Differences, its compatibility statement, and every listed difference
// must occur. Findings lists known failures (of upstream or of Sluice):
// reported as failed without failing the run, and failing it once fixed.
// WriteReports writes one report per implementation in the shape of
// upstream's ConformanceReport and a Markdown table of cases x
// implementations.
//
// Package gateway runs upstream's Gateway profile itself, unchanged, with
// Sluice's image, in a cluster.
//
// # Concurrency
//
// Each implementation gets its own namespaces, ports and EPP processes; a
// case runs in its own goroutine so that a failed check ends only that
// case. Fixtures and Envoy are used by one case at a time.
package conformance
