package runner

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"k8s.io/utils/clock"

	"github.com/sluice-gw/sluice/flowcontrol/replication"
	"github.com/sluice-gw/sluice/runner/runnertest"
)

// recordingExchanger is an admission controller's side of the exchange: it sends summaries counting up, and records
// what it hears.
type recordingExchanger struct {
	self string
	// version is the wire version it sends every peer in.
	version byte
	mu      sync.Mutex
	seq     uint64
	got     []replication.Summary
}

func (r *recordingExchanger) PeerSummary() replication.Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	return replication.Summary{From: r.self, Seq: r.seq, Seats: 4, Idle: []replication.EndpointCount{{Endpoint: "10.0.0.1:8000", N: 1}},
		PoolSlots: 4, PoolRunning: 4}
}

func (r *recordingExchanger) PeerWireVersion(string) byte { return r.version }

func (r *recordingExchanger) HearPeer(s replication.Summary) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, s)
}

func (r *recordingExchanger) heard() []replication.Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]replication.Summary(nil), r.got...)
}

// Two replicas over loopback gRPC: each one's summaries reach the other's admission on one stream, in order, in the
// wire version the sender chose for that peer (a, as to a peer of an older release, version 1, without the pool's slot
// limit), and hearing a summary makes its sender live.
func TestPeerExchangeOverGRPC(t *testing.T) {
	listen := func() (net.Listener, string) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l, l.Addr().String()
	}
	la, a := listen()
	lb, b := listen()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	traffic := map[string]*peerTraffic{a: newPeerTraffic(), b: newPeerTraffic()}
	replica := func(l net.Listener, self string, peers []string, version byte) (*recordingExchanger, *replication.View) {
		view, err := replication.NewView(self, peers, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		adm := &recordingExchanger{self: self, version: version}
		srv := grpc.NewServer()
		srv.RegisterService(&peerExchangeDesc, &peerReceiver{view: view, admission: adm, clock: clock.RealClock{}, logger: testr.New(t),
			traffic: traffic[self]})
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(srv.Stop)
		sender := &peerSender{view: view, admission: adm, interval: 5 * time.Millisecond, clock: clock.RealClock{}, logger: testr.New(t),
			traffic: traffic[self]}
		wg.Go(func() {
			if err := sender.Start(ctx); err != nil {
				t.Error(err)
			}
		})
		return adm, view
	}
	admA, viewA := replica(la, a, []string{a, b}, 1)
	admB, viewB := replica(lb, b, []string{b, a}, replication.WireVersion)
	runnertest.Eventually(t, "b hears a's summaries", func() string {
		if got := admB.heard(); len(got) < 2 || got[0].From != a || got[len(got)-1].Seq <= got[0].Seq ||
			got[0].Version != 1 || got[0].PoolSlots != 0 || got[0].PoolRunning != 0 || got[0].Reads != replication.WireVersion {
			return "b heard " + summaryFroms(got)
		}
		return ""
	})
	runnertest.Eventually(t, "a hears b's summaries", func() string {
		if got := admA.heard(); len(got) == 0 || got[0].From != b || got[0].Idle[0].N != 1 ||
			got[0].Version != replication.WireVersion || got[0].PoolSlots != 4 || got[0].PoolRunning != 4 || got[0].Reads != replication.WireVersion {
			return "a heard " + summaryFroms(got)
		}
		return ""
	})
	if len(viewA.Live(time.Now())) != 2 || len(viewB.Live(time.Now())) != 2 {
		t.Fatalf("live: a sees %v, b sees %v; want both", viewA.Live(time.Now()), viewB.Live(time.Now()))
	}
	// The metrics count both directions per peer; a peer that leaves the list loses its series.
	runnertest.Eventually(t, "a counts what it sent b and received from it", func() string {
		tr := traffic[a]
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if c := tr.peers[b]; c == nil || c.sent == 0 || c.bytes < c.sent || c.received == 0 {
			return fmt.Sprintf("a's counts for b: %+v", c)
		}
		return ""
	})
	viewA.SetPeers([]string{a})
	runnertest.Eventually(t, "a forgets b's series once b left its list", func() string {
		if n := testutil.CollectAndCount(traffic[a], "sluice_peer_summaries_sent_total"); n != 0 {
			return fmt.Sprintf("%d series", n)
		}
		return ""
	})
}

func summaryFroms(got []replication.Summary) string {
	out := ""
	for _, s := range got {
		out += s.From + " "
	}
	return "[" + out + "]"
}
