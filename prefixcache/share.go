package prefixcache

import (
	"sync"
	"sync/atomic"
)

// Sharing inserts among EPP replicas: with N replicas each routes 1/N of the prompts, so each index learns only
// where its own share went (see the package doc). A replica that shares its index tells its peers, every exchange
// interval, the blocks its Route calls inserted (TakeInserts) and takes theirs in (Insert), so every replica's index
// holds, approximately, what any replica routed. Only insertions travel: a block a pod already held is not sent
// again when it is routed there again, so a hot prefix costs its bytes once per pod, not once per request; the price
// is that a peer's index does not see such a block become recent again, and may evict it before the pod does.

// PodInserts are the block hashes Route inserted into one pod's LRU, in the order it inserted them (each prompt's
// chain from its last new block to its first), so that a peer touching them in that order ends with the prefix most
// recent, as the router did.
type PodInserts struct {
	Pod    PodID
	Hashes []uint64
}

// insertLog is the bounded log of hashes Route inserted since the last TakeInserts.
type insertLog struct {
	on atomic.Bool // read by Route without the lock

	mu      sync.Mutex
	limit   int
	n       int // hashes logged
	pods    []PodInserts
	dropped int // hashes not logged since the last TakeInserts: the log was full
}

// ShareInserts makes Route log the block hashes it inserts, at most limit between two TakeInserts (so at most
// limit travel per exchange interval, 8 bytes each); what finds the log full is dropped. limit ≤ 0 stops logging.
func (ix *Index) ShareInserts(limit int) {
	l := &ix.inserts
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on.Store(limit > 0)
	l.limit = limit
	if limit <= 0 {
		l.pods, l.n = nil, 0
	}
}

// logInserts logs the newly inserted blocks of one routed chain, in the order Route inserted them (last block
// first). When the log has no room for all of them it keeps the chain's first blocks, which are what a match needs
// (it stops at the first block missing).
func (l *insertLog) logInserts(id PodID, inserted []uint64) {
	if len(inserted) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.on.Load() {
		return
	}
	room := min(len(inserted), l.limit-l.n)
	l.dropped += len(inserted) - room
	if room <= 0 {
		return
	}
	i := len(l.pods) - 1
	if i < 0 || l.pods[i].Pod != id {
		l.pods = append(l.pods, PodInserts{Pod: id})
		i++
	}
	l.pods[i].Hashes = append(l.pods[i].Hashes, inserted[len(inserted)-room:]...)
	l.n += room
}

// TakeInserts returns the hashes Route inserted since the last call, by pod in the order it routed (a pod appears
// once per run of consecutive routes to it), and how many were dropped because the log was full.
func (ix *Index) TakeInserts() (inserts []PodInserts, dropped int) {
	l := &ix.inserts
	l.mu.Lock()
	defer l.mu.Unlock()
	inserts, dropped = l.pods, l.dropped
	l.pods, l.n, l.dropped = nil, 0, 0
	return inserts, dropped
}

// Insert takes in a peer's inserts: each pod this index knows now holds the hashes, touched in the order given. It
// changes neither the pod's requests in flight nor its calibration (the peer's requests are the peer's to check),
// and logs nothing for this replica's own peers. A pod this index has not indexed yet is skipped: its cache
// geometry is not known here, and it registers at its first scoring.
func (ix *Index) Insert(inserts []PodInserts) {
	reg := ix.reg.Load()
	for _, in := range inserts {
		p := reg.pods[in.Pod]
		if p == nil {
			continue
		}
		p.mu.Lock()
		for _, h := range in.Hashes {
			if h != 0 && !p.gone { // 0 marks the tables' empty slots; no chain hash is 0 (hash.go)
				p.touchLocked(h)
			}
		}
		p.mu.Unlock()
	}
}
