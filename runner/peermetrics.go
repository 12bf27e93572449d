package runner

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The peer exchange's traffic metrics. Their peer label takes the names of the configured peers only (a summary from
// a replica that is not a peer is dropped before it counts), and a peer that leaves the list (a rollout replaced it)
// loses its series, so the series are bounded by the peer list, not by the replicas ever seen.
var (
	peerSummariesSentDesc = prometheus.NewDesc("sluice_peer_summaries_sent_total",
		"Summaries this replica sent to each peer on the peer exchange.", []string{"peer"}, nil)
	peerBytesSentDesc = prometheus.NewDesc("sluice_peer_summary_bytes_sent_total",
		"Bytes of the summaries (their wire form) this replica sent to each peer.", []string{"peer"}, nil)
	peerSummariesReceivedDesc = prometheus.NewDesc("sluice_peer_summaries_received_total",
		"Summaries this replica received from each peer and took in.", []string{"peer"}, nil)
	peerSummariesRefusedDesc = prometheus.NewDesc("sluice_peer_summaries_refused_total",
		"Summaries received that did not parse (the stream that carried one is ended).", nil, nil)
)

// peerTraffic counts the summaries sent to and received from each peer; a nil *peerTraffic counts nothing.
type peerTraffic struct {
	mu      sync.Mutex
	peers   map[string]*peerCounts
	refused uint64
}

type peerCounts struct{ sent, bytes, received uint64 }

var _ prometheus.Collector = (*peerTraffic)(nil)

func newPeerTraffic() *peerTraffic { return &peerTraffic{peers: map[string]*peerCounts{}} }

// exchangeTraffic is the process's peer traffic, registered on the registry /metrics serves with the first exchange.
var exchangeTraffic = sync.OnceValues(func() (*peerTraffic, error) {
	t := newPeerTraffic()
	return t, crmetrics.Registry.Register(t)
})

// keep makes peers the peers counted: each gets its series, and any other loses its own (it left the list). The
// sender calls it every interval with the peer list; a summary counted for a peer not in it is not counted, so a
// summary received while its sender leaves the list cannot bring back a series.
func (t *peerTraffic) keep(peers []string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for p := range t.peers {
		if !slices.Contains(peers, p) {
			delete(t.peers, p)
		}
	}
	for _, p := range peers {
		if t.peers[p] == nil {
			t.peers[p] = &peerCounts{}
		}
	}
}

// sent counts a summary of n bytes sent to peer.
func (t *peerTraffic) sent(peer string, n int) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.peers[peer]; c != nil {
		c.sent++
		c.bytes += uint64(n)
	}
}

// received counts a summary taken in from peer.
func (t *peerTraffic) received(peer string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.peers[peer]; c != nil {
		c.received++
	}
}

// refusedOne counts a summary that did not parse.
func (t *peerTraffic) refusedOne() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.refused++
}

func (t *peerTraffic) Describe(ch chan<- *prometheus.Desc) {
	ch <- peerSummariesSentDesc
	ch <- peerBytesSentDesc
	ch <- peerSummariesReceivedDesc
	ch <- peerSummariesRefusedDesc
}

func (t *peerTraffic) Collect(ch chan<- prometheus.Metric) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for peer, c := range t.peers {
		ch <- prometheus.MustNewConstMetric(peerSummariesSentDesc, prometheus.CounterValue, float64(c.sent), peer)
		ch <- prometheus.MustNewConstMetric(peerBytesSentDesc, prometheus.CounterValue, float64(c.bytes), peer)
		ch <- prometheus.MustNewConstMetric(peerSummariesReceivedDesc, prometheus.CounterValue, float64(c.received), peer)
	}
	ch <- prometheus.MustNewConstMetric(peerSummariesRefusedDesc, prometheus.CounterValue, float64(t.refused))
}
