package dataplane

import (
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // resolves the router's @type
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3" // resolves UpstreamTlsContext
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"        // resolves HttpProtocolOptions
	envoytypev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"
	"sigs.k8s.io/yaml"
)

// TestEnvoyExample validates examples/envoy/envoy.yaml as far as possible
// without an Envoy binary: it must decode into Envoy's bootstrap proto with
// every typed_config resolved, pass go-control-plane's generated validation,
// and configure ext_proc and routing the way this package emulates them.
func TestEnvoyExample(t *testing.T) {
	checkEnvoyExample(t, "../../examples/envoy/envoy.yaml", BodyFullDuplexStreamed)
}

// TestEnvoyExampleBufferedRequestBody validates the opt-in variant examples/envoy/envoy-buffered-request-body.yaml as
// TestEnvoyExample does envoy.yaml: the request body BUFFERED, as RequestBodyMode BodyBuffered emulates, and a route
// buffer limit that lets the bodies this data plane accepts through (Envoy answers 413 beyond it).
func TestEnvoyExampleBufferedRequestBody(t *testing.T) {
	checkEnvoyExample(t, "../../examples/envoy/envoy-buffered-request-body.yaml", BodyBuffered)
}

// TestEnvoyExampleResponseObserver validates the opt-in variant examples/envoy/envoy-response-observer.yaml as
// ResponseObserver emulates it: envoy.yaml's request phase, the routing filter's response skipped (so its
// protocol_config says response_body_mode NONE), and a second ext_proc filter on the same cluster in observability
// mode that sends the response headers (with the request.id attribute), the body STREAMED and the trailers.
func TestEnvoyExampleResponseObserver(t *testing.T) {
	_, hcm := loadEnvoyExample(t, "../../examples/envoy/envoy-response-observer.yaml")
	filters := hcm.GetHttpFilters()
	names := []string{}
	for _, f := range filters {
		names = append(names, f.GetName())
	}
	if !slices.Equal(names, []string{"envoy.filters.http.header_mutation", "envoy.filters.http.ext_proc", "envoy.filters.http.ext_proc",
		"envoy.filters.http.router"}) {
		t.Fatalf("http filters %v, want header_mutation, the routing ext_proc, the observer ext_proc, router", names)
	}
	var routing, observer extprocfilterv3.ExternalProcessor
	if err := filters[1].GetTypedConfig().UnmarshalTo(&routing); err != nil {
		t.Fatal(err)
	}
	if err := filters[2].GetTypedConfig().UnmarshalTo(&observer); err != nil {
		t.Fatal(err)
	}
	pm := routing.GetProcessingMode()
	if routing.GetObservabilityMode() || pm.GetRequestHeaderMode() != extprocfilterv3.ProcessingMode_SEND ||
		pm.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED ||
		pm.GetResponseHeaderMode() != extprocfilterv3.ProcessingMode_SKIP || pm.GetResponseBodyMode() != extprocfilterv3.ProcessingMode_NONE ||
		pm.GetResponseTrailerMode() != extprocfilterv3.ProcessingMode_SKIP {
		t.Errorf("routing filter: processing mode %v, want the request as GIE's and the response skipped", pm)
	}
	om := observer.GetProcessingMode()
	if !observer.GetObservabilityMode() || om.GetRequestHeaderMode() != extprocfilterv3.ProcessingMode_SKIP ||
		om.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_NONE ||
		om.GetResponseHeaderMode() != extprocfilterv3.ProcessingMode_SEND || om.GetResponseBodyMode() != extprocfilterv3.ProcessingMode_STREAMED ||
		om.GetResponseTrailerMode() != extprocfilterv3.ProcessingMode_SEND {
		t.Errorf("observer filter: observability %v, processing mode %v; want observability mode, the response only, its body STREAMED",
			observer.GetObservabilityMode(), om)
	}
	if !slices.Contains(observer.GetResponseAttributes(), "request.id") {
		t.Errorf("observer filter: response attributes %v lack request.id, which joins it to the routed request", observer.GetResponseAttributes())
	}
	if a, b := routing.GetGrpcService().GetEnvoyGrpc().GetClusterName(), observer.GetGrpcService().GetEnvoyGrpc().GetClusterName(); a != b {
		t.Errorf("the filters' clusters %q and %q differ: both streams of a request must reach the same EPP", a, b)
	}
	if !slices.Contains(observer.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(), metadata.DestinationEndpointNamespace) {
		t.Errorf("observer filter does not forward %s (the served endpoint)", metadata.DestinationEndpointNamespace)
	}
}

// loadEnvoyExample decodes the bootstrap at path into Envoy's proto, with every typed_config resolved, checks it
// with go-control-plane's generated validation, and returns it with its listener's HTTP connection manager.
func loadEnvoyExample(t *testing.T, path string) (*bootstrapv3.Bootstrap, *hcmv3.HttpConnectionManager) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("not a valid Envoy bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("bootstrap fails Envoy's proto validation: %v", err)
	}
	listeners := bs.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		t.Fatalf("%d listeners, want 1", len(listeners))
	}
	var hcm hcmv3.HttpConnectionManager
	if err := listeners[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	return &bs, &hcm
}

func checkEnvoyExample(t *testing.T, path string, requestBody BodyMode) {
	bs, hcm := loadEnvoyExample(t, path)
	filters := hcm.GetHttpFilters()
	if len(filters) != 3 || filters[0].GetName() != "envoy.filters.http.header_mutation" ||
		filters[1].GetName() != "envoy.filters.http.ext_proc" || filters[2].GetName() != "envoy.filters.http.router" {
		t.Fatalf("http filters %v, want header_mutation, ext_proc, router", filters)
	}
	// The data plane drops the client's destination headers before asking the EPP; the example must too.
	var strip headermutationv3.HeaderMutation
	if err := filters[0].GetTypedConfig().UnmarshalTo(&strip); err != nil {
		t.Fatal(err)
	}
	var removed []string
	for _, m := range strip.GetMutations().GetRequestMutations() {
		removed = append(removed, m.GetRemove())
	}
	for _, h := range []string{metadata.DestinationEndpointKey, metadata.DestinationEndpointServedKey} {
		if !slices.Contains(removed, h) {
			t.Errorf("the example passes a client-sent %s on (request mutations remove %v)", h, removed)
		}
	}
	var ep extprocfilterv3.ExternalProcessor
	if err := filters[1].GetTypedConfig().UnmarshalTo(&ep); err != nil {
		t.Fatal(err)
	}
	pm := ep.GetProcessingMode()
	wantRequestBody := extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if requestBody == BodyBuffered {
		wantRequestBody = extprocfilterv3.ProcessingMode_BUFFERED
	}
	if pm.GetRequestHeaderMode() != extprocfilterv3.ProcessingMode_SEND ||
		pm.GetResponseHeaderMode() != extprocfilterv3.ProcessingMode_SEND ||
		pm.GetRequestBodyMode() != wantRequestBody ||
		pm.GetResponseBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		t.Errorf("processing mode %v, want headers SEND, request body %v, response body FULL_DUPLEX_STREAMED", pm, wantRequestBody)
	}
	limit := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0].GetRequestBodyBufferLimit()
	if requestBody == BodyBuffered && limit.GetValue() < DefaultMaxRequestBodyBytes {
		t.Errorf("route request_body_buffer_limit %v: a BUFFERED body longer than it gets 413; want at least %d", limit, DefaultMaxRequestBodyBytes)
	}
	if got := ep.GetMessageTimeout().AsDuration(); got != DefaultMessageTimeout {
		t.Errorf("message_timeout %v, want %v like the data plane", got, DefaultMessageTimeout)
	}
	if ep.GetFailureModeAllow() {
		t.Errorf("example should fail closed, GIE's default")
	}
	fwd := ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped()
	if !slices.Contains(fwd, metadata.DestinationEndpointNamespace) || !slices.Contains(fwd, metadata.SubsetFilterNamespace) {
		t.Errorf("forwarding namespaces %v lack %s or %s", fwd, metadata.DestinationEndpointNamespace, metadata.SubsetFilterNamespace)
	}
	extProcCluster := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName()

	route := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0].GetRoute()
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	dst, ok := clusters[route.GetCluster()]
	if !ok {
		t.Fatalf("route targets unknown cluster %q", route.GetCluster())
	}
	if dst.GetType() != clusterv3.Cluster_ORIGINAL_DST || dst.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED ||
		!dst.GetOriginalDstLbConfig().GetUseHttpHeader() ||
		dst.GetOriginalDstLbConfig().GetHttpHeaderName() != metadata.DestinationEndpointKey {
		t.Errorf("destination cluster %v, want ORIGINAL_DST on header %s", dst, metadata.DestinationEndpointKey)
	}
	epp, ok := clusters[extProcCluster]
	if !ok {
		t.Fatalf("ext_proc names unknown cluster %q", extProcCluster)
	}
	if epp.GetTransportSocket().GetName() != "envoy.transport_sockets.tls" {
		t.Errorf("EPP cluster does not use TLS")
	}
	if _, ok := epp.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; !ok {
		t.Errorf("EPP cluster lacks HTTP/2 protocol options (gRPC needs HTTP/2)")
	}
}

// TestEnvoyEPPFailure503 validates the opt-in examples/envoy/epp-failure-503.yaml as Config.EPPFailureRetryAfter
// emulates it: an ext_proc filter setting (status_on_error 503) and an HTTP connection manager's local_reply_config,
// each decoded into its Envoy proto and valid by Envoy's proto rules, with one mapper that adds a Retry-After of whole
// seconds to a local reply of 503, and only if it has none.
func TestEnvoyEPPFailure503(t *testing.T) {
	raw, err := os.ReadFile("../../examples/envoy/epp-failure-503.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var parts map[string]json.RawMessage
	if err := yaml.Unmarshal(raw, &parts); err != nil {
		t.Fatal(err)
	}
	if len(parts) != 2 {
		t.Fatalf("%d settings, want 2 (ext_proc, http_connection_manager)", len(parts))
	}
	var ep extprocfilterv3.ExternalProcessor
	if err := protojson.Unmarshal(parts["ext_proc"], &ep); err != nil {
		t.Fatalf("ext_proc: not fields of Envoy's ext_proc filter: %v", err)
	}
	if err := ep.ValidateAll(); err != nil {
		t.Fatalf("ext_proc: fails Envoy's proto validation: %v", err)
	}
	if got := ep.GetStatusOnError().GetCode(); got != envoytypev3.StatusCode_ServiceUnavailable {
		t.Errorf("ext_proc status_on_error %v, want ServiceUnavailable (503), as the data plane answers", got)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := protojson.Unmarshal(parts["http_connection_manager"], &hcm); err != nil {
		t.Fatalf("http_connection_manager: not fields of Envoy's HTTP connection manager: %v", err)
	}
	lr := hcm.GetLocalReplyConfig()
	if err := lr.ValidateAll(); err != nil {
		t.Fatalf("local_reply_config fails Envoy's proto validation: %v", err)
	}
	if len(lr.GetMappers()) != 1 {
		t.Fatalf("%d mappers, want 1", len(lr.GetMappers()))
	}
	m := lr.GetMappers()[0]
	cmp := m.GetFilter().GetStatusCodeFilter().GetComparison()
	if cmp.GetOp() != accesslogv3.ComparisonFilter_EQ || cmp.GetValue().GetDefaultValue() != http.StatusServiceUnavailable {
		t.Errorf("mapper filter %v, want status code EQ 503", m.GetFilter())
	}
	if m.GetStatusCode() != nil || m.GetBody() != nil || m.GetBodyFormatOverride() != nil {
		t.Errorf("mapper rewrites the status or the body: the data plane keeps both")
	}
	var retryAfter string
	for _, h := range m.GetHeadersToAdd() {
		if strings.EqualFold(h.GetHeader().GetKey(), "retry-after") {
			retryAfter = h.GetHeader().GetValue()
			if h.GetAppendAction() != corev3.HeaderValueOption_ADD_IF_ABSENT {
				t.Errorf("Retry-After appended %v, want ADD_IF_ABSENT: an EPP's own Retry-After must stand", h.GetAppendAction())
			}
		}
	}
	secs, err := strconv.Atoi(retryAfter)
	if err != nil || secs < 1 {
		t.Fatalf("Retry-After %q, want whole seconds, at least 1", retryAfter)
	}

	// The emulation answers what the settings make Envoy answer.
	cfg := Config{EPPFailureRetryAfter: time.Duration(secs) * time.Second}
	for _, tc := range []struct {
		status                int
		retryAfter, wantAfter string
	}{
		{status: http.StatusServiceUnavailable, wantAfter: retryAfter},
		{status: http.StatusServiceUnavailable, retryAfter: "17", wantAfter: "17"},
		{status: http.StatusInternalServerError},
		{status: http.StatusTooManyRequests, retryAfter: "7", wantAfter: "7"},
		{status: http.StatusBadGateway},
	} {
		h := http.Header{}
		if tc.retryAfter != "" {
			h.Set("Retry-After", tc.retryAfter)
		}
		if cfg.localReply(tc.status, h); h.Get("Retry-After") != tc.wantAfter {
			t.Errorf("local reply %d with Retry-After %q: Retry-After %q, want %q", tc.status, tc.retryAfter,
				h.Get("Retry-After"), tc.wantAfter)
		}
	}
}
