package runner

import (
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/utils/clock"

	"github.com/sluice-gw/sluice/flowcontrol/replication"
)

// The peer exchange (issue 22): every --peer-exchange-interval each replica sends every peer its summary
// (replication.Summary in its wire form) on one client stream per peer, to the PeerExchange service on the peer's
// --grpc-health-port, the address replicas know each other by. A summary received counts as hearing the peer, like a
// health probe answered. Nothing on the request path waits for a peer: admission acts on the latest summaries held.

// PeerExchanger is what the peer exchange needs of the admission controller (plugins.FlowControl): the summary to
// send, the wire version each peer reads, and the peers' summaries to take in.
type PeerExchanger interface {
	PeerSummary() replication.Summary
	PeerWireVersion(peer string) byte
	HearPeer(replication.Summary)
}

// peerExchangeMethod is the full name of the stream replicas send summaries on.
const peerExchangeMethod = "/sluice.replication.v1.PeerExchange/Summaries"

// peerExchangeDesc describes the service by hand: one client stream of google.protobuf.BytesValue (a summary's wire
// form each), answered with google.protobuf.Empty when the sender closes it.
var peerExchangeDesc = grpc.ServiceDesc{
	ServiceName: "sluice.replication.v1.PeerExchange",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Summaries",
		ClientStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			return srv.(*peerReceiver).receive(stream)
		},
	}},
	Metadata: "sluice/replication/v1/peers",
}

// peerReceiver takes in the summaries peers send.
type peerReceiver struct {
	view      *replication.View
	admission PeerExchanger
	clock     clock.PassiveClock
	logger    logr.Logger
	traffic   *peerTraffic    // nil: not counted
	stopping  <-chan struct{} // closed as the replica stops; nil: never
}

// receive reads one peer's stream until it ends, or until this replica stops (stopping): a peer sends for as long as
// it lives, so the health server's graceful stop would otherwise wait its whole grace period for the stream.
func (p *peerReceiver) receive(stream grpc.ServerStream) error {
	done := make(chan error, 1)
	go func() { done <- p.receiveAll(stream) }()
	select {
	case err := <-done:
		return err
	case <-p.stopping:
		return status.Error(codes.Unavailable, "replica stopping")
	}
}

// receiveAll reads stream until it ends. A summary that does not parse ends the stream with an error; one from a
// replica that is not a peer (a stray or misconfigured sender) is dropped.
func (p *peerReceiver) receiveAll(stream grpc.ServerStream) error {
	reads := declaredWireVersion(stream.Context())
	for {
		var msg wrapperspb.BytesValue
		if err := stream.RecvMsg(&msg); err != nil {
			if errors.Is(err, io.EOF) {
				return stream.SendMsg(&emptypb.Empty{})
			}
			return err
		}
		s, err := replication.ParseSummary(msg.GetValue())
		if err != nil {
			p.traffic.refusedOne()
			return err
		}
		if !p.view.Heard(s.From, p.clock.Now()) {
			p.logger.V(1).Info("Dropped a summary from a replica that is not a peer", "from", s.From)
			continue
		}
		p.traffic.received(s.From)
		s.Reads = reads
		p.admission.HearPeer(s)
	}
}

// wireVersionKey is the stream metadata in which a sender declares the newest summary wire version it reads, so its
// peers send it that version from the start (replication.Exchange.WireVersion). Releases from before it ignore it.
const wireVersionKey = "sluice-peer-wire-version"

// declaredWireVersion returns the wire version a peer's stream declares it reads; 0 when it declares none or one
// that is not a version.
func declaredWireVersion(ctx context.Context) byte {
	vs := metadata.ValueFromIncomingContext(ctx, wireVersionKey)
	if len(vs) != 1 {
		return 0
	}
	v, err := strconv.ParseUint(vs[0], 10, 8)
	if err != nil {
		return 0
	}
	return byte(v)
}

// peerSender sends this replica's summary to every peer each interval. Each peer has a goroutine of its own holding
// the latest summary not yet sent, so a slow or unreachable peer delays nobody and is sent only the newest.
type peerSender struct {
	view      *replication.View
	admission PeerExchanger
	interval  time.Duration
	clock     clock.WithTicker
	logger    logr.Logger
	traffic   *peerTraffic // nil: not counted
}

// Start implements manager.Runnable: it sends until ctx ends.
func (p *peerSender) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	type sender struct {
		out    chan []byte
		cancel context.CancelFunc
	}
	outs := map[string]sender{}
	defer func() {
		for _, s := range outs {
			s.cancel()
		}
	}()
	ticker := p.clock.NewTicker(p.interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		}
		summary := p.admission.PeerSummary()
		wires := map[byte][]byte{} // by wire version: peers of another release are sent what they read
		peers := p.view.Peers()
		for peer, s := range outs {
			if !slices.Contains(peers, peer) { // gone (a rollout replaced it): its sender and connection end
				s.cancel()
				delete(outs, peer)
			}
		}
		p.traffic.keep(peers)
		for _, peer := range peers {
			v := p.admission.PeerWireVersion(peer)
			wire, ok := wires[v]
			if !ok {
				var err error
				if wire, err = summary.AppendVersion(nil, v); err != nil {
					return err
				}
				wires[v] = wire
			}
			s, ok := outs[peer]
			if !ok {
				sctx, cancel := context.WithCancel(ctx)
				s = sender{out: make(chan []byte, 1), cancel: cancel}
				outs[peer] = s
				wg.Go(func() { p.sendTo(sctx, peer, s.out) })
			}
			select {
			case <-s.out: // superseded
			default:
			}
			s.out <- wire
		}
	}
}

// sendTo streams the summaries put on out to peer until ctx ends, opening the stream again after an error.
func (p *peerSender) sendTo(ctx context.Context, peer string, out <-chan []byte) {
	conn, err := grpc.NewClient(peer, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.logger.Error(err, "Cannot send summaries to peer", "peer", peer)
		return
	}
	defer conn.Close()
	var stream grpc.ClientStream
	for {
		var wire []byte
		select {
		case <-ctx.Done():
			if stream != nil {
				_ = stream.CloseSend()
			}
			return
		case wire = <-out:
		}
		if stream == nil {
			sctx := metadata.AppendToOutgoingContext(ctx, wireVersionKey, strconv.Itoa(replication.WireVersion))
			if stream, err = conn.NewStream(sctx, &peerExchangeDesc.Streams[0], peerExchangeMethod); err != nil {
				stream = nil
				continue // the peer is down or starting: its liveness says so; the next summary tries again
			}
		}
		if err := stream.SendMsg(wrapperspb.Bytes(wire)); err != nil {
			stream = nil
			continue
		}
		p.traffic.sent(peer, len(wire))
	}
}
