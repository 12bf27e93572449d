package dataplane

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// The data plane's ext_proc client keeps the fixed HTTP/2 windows of GIE's Envoy configuration: it announces them
// and, given an answer, sends no PING of its own (gRPC's window estimator, which Envoy does not have, would send one
// for it). An HTTP/2 server plays the EPP: it answers the client's first message and then sends a PING; the client
// handles its frames in order, so a PING the answer made it send comes before its ack of the server's PING.
func TestEPPClientKeepsEnvoysWindows(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	replicas, err := newEPPReplicas([]string{lis.Addr().String()}, BalanceRoundRobin, insecure.NewCredentials())
	if err != nil {
		t.Fatal(err)
	}
	defer replicas.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		stream, err := replicas.pick().Process(ctx)
		if err == nil {
			_ = stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
				RequestHeaders: &extprocv3.HttpHeaders{}}})
			_, _ = stream.Recv()
		}
	}()

	conn, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Minute)) // a guard against a hang, not a measured time
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := conn.Read(preface); err != nil || string(preface) != http2.ClientPreface {
		t.Fatalf("client preface %q: %v", preface, err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var streamWindow uint32
	connWindow := uint32(65535)
	settled := false // the client's own first frames (SETTINGS, WINDOW_UPDATE) are in once its stream begins
	ping := [8]byte{'e', 'n', 'v', 'o', 'y'}
	pinged := false
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the client's frames: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				streamWindow = v
			}
			if err := fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 && !settled {
				connWindow += f.Increment
			}
		case *http2.HeadersFrame:
			settled = true
		case *http2.DataFrame:
			if pinged {
				continue
			}
			// The answer: response headers, one message, then the server's PING.
			var block bytes.Buffer
			enc := hpack.NewEncoder(&block)
			_ = enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
			_ = enc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
			msg, err := proto.Marshal(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
				RequestHeaders: &extprocv3.HeadersResponse{}}})
			if err != nil {
				t.Fatal(err)
			}
			data := make([]byte, 5, 5+len(msg))
			binary.BigEndian.PutUint32(data[1:], uint32(len(msg)))
			data = append(data, msg...)
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
				t.Fatal(err)
			}
			if err := fr.WriteData(f.StreamID, false, data); err != nil {
				t.Fatal(err)
			}
			if err := fr.WritePing(false, ping); err != nil {
				t.Fatal(err)
			}
			pinged = true
		case *http2.PingFrame:
			if !f.IsAck() {
				t.Errorf("the client sent a PING of its own after an answer (gRPC's window estimator); Envoy sends none")
				_ = fr.WritePing(true, f.Data)
				continue
			}
			if f.Data != ping {
				continue
			}
			if streamWindow != EnvoyExtProcStreamWindow || connWindow != EnvoyExtProcConnWindow {
				t.Errorf("windows: stream %d (announced), connection %d; want Envoy's %d and %d",
					streamWindow, connWindow, EnvoyExtProcStreamWindow, EnvoyExtProcConnWindow)
			}
			return
		}
	}
}
