package runner

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPeerTrafficMetrics: each peer of the list has its own series of summaries and bytes sent and summaries received
// until it leaves the list, and nothing counted for another brings one back; summaries that did not parse are counted
// without a peer.
func TestPeerTrafficMetrics(t *testing.T) {
	tr := newPeerTraffic()
	tr.received("epp-b:9003") // before the sender's first interval: not a peer yet, not counted
	tr.keep([]string{"epp-b:9003", "epp-c:9003"})
	tr.sent("epp-b:9003", 60)
	tr.sent("epp-b:9003", 75)
	tr.sent("epp-c:9003", 60)
	tr.received("epp-b:9003")
	tr.refusedOne()
	want := `
# HELP sluice_peer_summaries_sent_total Summaries this replica sent to each peer on the peer exchange.
# TYPE sluice_peer_summaries_sent_total counter
sluice_peer_summaries_sent_total{peer="epp-b:9003"} 2
sluice_peer_summaries_sent_total{peer="epp-c:9003"} 1
# HELP sluice_peer_summary_bytes_sent_total Bytes of the summaries (their wire form) this replica sent to each peer.
# TYPE sluice_peer_summary_bytes_sent_total counter
sluice_peer_summary_bytes_sent_total{peer="epp-b:9003"} 135
sluice_peer_summary_bytes_sent_total{peer="epp-c:9003"} 60
# HELP sluice_peer_summaries_received_total Summaries this replica received from each peer and took in.
# TYPE sluice_peer_summaries_received_total counter
sluice_peer_summaries_received_total{peer="epp-b:9003"} 1
sluice_peer_summaries_received_total{peer="epp-c:9003"} 0
# HELP sluice_peer_summaries_refused_total Summaries received that did not parse (the stream that carried one is ended).
# TYPE sluice_peer_summaries_refused_total counter
sluice_peer_summaries_refused_total 1
`
	if err := testutil.CollectAndCompare(tr, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	tr.keep([]string{"epp-b:9003"})
	tr.received("epp-c:9003") // received while epp-c left the list: it does not bring its series back
	if n := testutil.CollectAndCount(tr, "sluice_peer_summaries_received_total"); n != 1 {
		t.Fatalf("%d series of summaries received after epp-c left, want 1", n)
	}
	var none *peerTraffic
	none.sent("x", 1) // a nil peerTraffic counts nothing and does not panic
}
