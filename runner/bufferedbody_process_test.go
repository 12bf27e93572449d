package runner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// TestBufferedBodyProcess plays a proxy that buffers the request body against the EPP's gRPC server: the body comes in
// one message, here larger than gRPC's 4 MiB default message size, after the EPP answered the headers, and one body
// answer routes the request.
func TestBufferedBodyProcess(t *testing.T) {
	server := runnertest.StartModelServer(t, "127.0.0.1:0")
	epp := runnertest.StartEPP(t, nil, "--static-endpoints="+server.Addr, "--secure-serving=false")
	runnertest.Eventually(t, "a request is routed", func() string {
		if a := runnertest.Route(t, epp.GRPCPort, false, nil, completion("are you there?"), nil); a.Destination != server.Addr {
			return fmt.Sprintf("answer %+v, want routed to %s", a, server.Addr)
		}
		return ""
	})

	body, err := json.Marshal(completion(strings.Repeat("tell me more ", 6<<20/13)))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", epp.GRPCPort), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20))) // off the hot path the body goes back
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	headers := requestHeaders(map[string]string{"x-request-id": "buffered-6MiB"})
	headers.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED,
		ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	send(t, stream, headers)
	if answer, err := stream.Recv(); err != nil || answer.GetRequestHeaders() == nil {
		t.Fatalf("answer to the headers %v (%v), want a headers answer before the body is sent", answer, err)
	}
	send(t, stream, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}})
	answer, err := stream.Recv()
	if err != nil {
		t.Fatalf("a %d-byte buffered body: %v", len(body), err)
	}
	var destination string
	for _, h := range answer.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == metadata.DestinationEndpointKey {
			destination = string(h.GetHeader().GetRawValue())
		}
	}
	if destination != server.Addr {
		t.Fatalf("answer to the %d-byte body %.300v, want a body answer routing to %s", len(body), answer, server.Addr)
	}
}
