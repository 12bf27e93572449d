package prefixcache

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// PodID names a model-server pod. It has the layout of Kubernetes'
// NamespacedName, so callers convert one without allocating.
type PodID struct {
	Namespace string
	Name      string
}

func (p PodID) String() string { return p.Namespace + "/" + p.Name }

// CacheInfo is what a pod reports about its KV cache (vLLM's
// vllm:cache_config_info). Zero fields mean "not reported" and take the
// configured defaults.
type CacheInfo struct {
	// NumBlocks is the pod's KV capacity in blocks (num_gpu_blocks).
	NumBlocks int
	// BlockTokens is the pod's KV block size in tokens (block_size).
	BlockTokens int
}

// Load is a pod's scraped load.
type Load struct {
	Queued        int     // requests waiting in the model server
	Running       int     // requests being decoded
	KVUtilization float64 // fraction of KV blocks in use, 0..1
}

// Candidate is a pod the scheduler may pick.
type Candidate struct {
	Pod   PodID
	Cache CacheInfo
	Load  Load
}

// Prompt is a request's prompt with its salt: rendered (Rendered, by
// AppendText or AppendChat), or built by ChatPrompt or TextPrompt, which
// hash the same rendering without writing it out. Chains, if set, keeps its
// chains for the request's later calls.
type Prompt struct {
	Salt     Salt
	Rendered []byte
	Chains   *Chains
	src      source
}

// Routed is what Route predicted for the pod it recorded.
type Routed struct {
	// MatchedBlocks is how many leading blocks the pod was predicted to
	// hold before this request; TotalBlocks how many the prompt has.
	MatchedBlocks, TotalBlocks int
}

// groupPods is how many pods share one holder table: one bit each in a
// uint64.
const groupPods = 64

// numShards splits each holder table; a power of two.
const numShards = 64

// holderShard maps block hashes to a bit set of the pods of its group that
// hold them.
type holderShard struct {
	mu      sync.RWMutex
	holders map[uint64]uint64
	_       [32]byte // keep neighbouring shards' locks off one cache line
}

// group is the holder table of up to 64 pods.
type group struct {
	shards [numShards]holderShard
}

func newGroup() *group {
	g := &group{}
	for i := range g.shards {
		g.shards[i].holders = map[uint64]uint64{}
	}
	return g
}

func (g *group) shard(h uint64) *holderShard { return &g.shards[h>>(64-6)] }

// held returns the bits of the group's pods that hold h.
func (g *group) held(h uint64) uint64 {
	s := g.shard(h)
	s.mu.RLock()
	v := s.holders[h]
	s.mu.RUnlock()
	return v
}

func (g *group) set(h, bit uint64) {
	s := g.shard(h)
	s.mu.Lock()
	s.holders[h] |= bit
	s.mu.Unlock()
}

func (g *group) clear(h, bit uint64) {
	s := g.shard(h)
	s.mu.Lock()
	if v := s.holders[h] &^ bit; v == 0 {
		delete(s.holders, h)
	} else {
		s.holders[h] = v
	}
	s.mu.Unlock()
}

// pod is one indexed model server.
type pod struct {
	id    PodID
	group *group
	slot  int    // index in group
	bit   uint64 // 1 << slot

	// Mirrors of the fields below, for lock-free checks on the hot path.
	blockTokens atomic.Int64
	nominal     atomic.Int64
	inflight    atomic.Int64 // routed by this index, not yet finished

	mu      sync.Mutex
	gone    bool     // forgotten: refuse new entries
	table   lruTable // what the pod is believed to hold
	cal     calibration
	evicted []uint64 // scratch
	shared  []uint64 // scratch: what Route inserted, for the peers (share.go)
}

// touchLocked makes h the pod's most recent block, inserting it (and evicting its least recent block when full); it
// reports whether h was inserted. Each eviction is cleared from the holder table before the next insertion: a block
// evicted here may be one touched again later by the caller's loop.
func (p *pod) touchLocked(h uint64) bool {
	inserted, ev := p.table.touch(h, p.evicted[:0])
	for _, e := range ev {
		p.group.clear(e, p.bit)
	}
	if inserted {
		p.group.set(h, p.bit)
	}
	p.evicted = ev[:0]
	return inserted
}

// registry is an immutable snapshot of the indexed pods, replaced whole on
// every change so that readers need no lock.
type registry struct {
	pods   map[PodID]*pod
	groups []*group
	used   [][groupPods]bool // used[g][slot]
}

// Index predicts which pods hold which prompt prefixes in their KV cache and
// scores candidates by it. Create one with New. All methods are safe for
// concurrent use.
type Index struct {
	cfg Config
	rec Recorder

	reg   atomic.Pointer[registry]
	regMu sync.Mutex // serialises registry changes

	pending pendingTable
	scratch sync.Pool // *scoreScratch
	inserts insertLog // what Route inserted, for peer replicas (ShareInserts)
}

// Option configures an Index.
type Option func(*Index)

// WithRecorder reports the index's events to r.
func WithRecorder(r Recorder) Option { return func(ix *Index) { ix.rec = r } }

// New returns an empty index, or the configuration's errors.
func New(cfg Config, opts ...Option) (*Index, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid prefix cache config: %w", err)
	}
	ix := &Index{cfg: cfg, rec: NopRecorder{}}
	for _, o := range opts {
		o(ix)
	}
	ix.reg.Store(&registry{pods: map[PodID]*pod{}})
	ix.pending.init(cfg.MaxPending, cfg.PendingTTL)
	ix.scratch.New = func() any { return &scoreScratch{} }
	return ix, nil
}

// Config returns the index's configuration.
func (ix *Index) Config() Config { return ix.cfg }

// maxBlocks is how many blocks of blockTokens tokens are hashed at most.
func (ix *Index) maxBlocks(blockTokens int) int {
	return max(1, ix.cfg.MaxPrefixTokens/blockTokens)
}

// resolve returns the cache geometry a pod reporting c is indexed with.
func (ix *Index) resolve(c CacheInfo) (blockTokens, nominal int) {
	blockTokens, nominal = c.BlockTokens, c.NumBlocks
	if blockTokens <= 0 {
		blockTokens = ix.cfg.DefaultBlockTokens
	}
	if nominal <= 0 {
		nominal = ix.cfg.DefaultPodBlocks
	}
	return blockTokens, min(nominal, ix.cfg.MaxBlocksPerPod)
}

// lookup returns the indexed pod id, registering it when absent and room
// remains (nil otherwise), with its geometry brought up to date with c.
func (ix *Index) lookup(id PodID, c CacheInfo) *pod {
	p := ix.reg.Load().pods[id]
	if p == nil {
		if p = ix.register(id); p == nil {
			return nil
		}
	}
	bt, nominal := ix.resolve(c)
	if p.blockTokens.Load() != int64(bt) || p.nominal.Load() != int64(nominal) {
		ix.reconfigure(p, bt, nominal)
	}
	return p
}

func (ix *Index) register(id PodID) *pod {
	ix.regMu.Lock()
	defer ix.regMu.Unlock()
	old := ix.reg.Load()
	if p := old.pods[id]; p != nil {
		return p
	}
	if len(old.pods) >= ix.cfg.MaxPods {
		return nil
	}
	next := &registry{
		pods:   make(map[PodID]*pod, len(old.pods)+1),
		groups: old.groups,
		used:   append([][groupPods]bool(nil), old.used...),
	}
	for k, v := range old.pods {
		next.pods[k] = v
	}
	gi, slot := -1, -1
	for g := range next.used {
		for s, taken := range next.used[g] {
			if !taken {
				gi, slot = g, s
				break
			}
		}
		if gi >= 0 {
			break
		}
	}
	if gi < 0 {
		next.groups = append(append([]*group(nil), old.groups...), newGroup())
		next.used = append(next.used, [groupPods]bool{})
		gi, slot = len(next.groups)-1, 0
	}
	next.used[gi][slot] = true
	p := &pod{id: id, group: next.groups[gi], slot: slot, bit: 1 << slot}
	p.cal.reset()
	bt, nominal := ix.resolve(CacheInfo{})
	p.table = newLRUTable(nominal)
	p.blockTokens.Store(int64(bt))
	p.nominal.Store(int64(nominal))
	next.pods[id] = p
	ix.reg.Store(next)
	return p
}

// reconfigure applies a new block size or capacity to p. A new block size
// makes every entry meaningless; a new capacity keeps the most recent ones.
func (ix *Index) reconfigure(p *pod, blockTokens, nominal int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return
	}
	keep := p.table.appendAll(nil) // most recent first
	if int64(blockTokens) != p.blockTokens.Load() {
		for _, h := range keep {
			p.group.clear(h, p.bit)
		}
		keep = keep[:0]
	}
	p.table = newLRUTable(nominal)
	p.nominal.Store(int64(nominal))
	p.blockTokens.Store(int64(blockTokens))
	limit := p.cal.limit(nominal)
	p.table.setLimit(limit, nil)
	if len(keep) > limit {
		for _, h := range keep[limit:] {
			p.group.clear(h, p.bit)
		}
		keep = keep[:limit]
	}
	for i := len(keep) - 1; i >= 0; i-- { // oldest first
		p.table.touch(keep[i], nil)
	}
}

// Forget drops everything known about pod id (it left the pool). The pod's
// holder bits are cleared before its slot can go to another pod.
func (ix *Index) Forget(id PodID) {
	ix.regMu.Lock()
	defer ix.regMu.Unlock()
	old := ix.reg.Load()
	p := old.pods[id]
	if p == nil {
		return
	}
	p.mu.Lock()
	p.gone = true
	for _, h := range p.table.appendAll(nil) {
		p.group.clear(h, p.bit)
	}
	p.table = lruTable{head: noSlot, tail: noSlot}
	p.mu.Unlock()

	next := &registry{
		pods:   make(map[PodID]*pod, len(old.pods)),
		groups: old.groups,
		used:   append([][groupPods]bool(nil), old.used...),
	}
	for k, v := range old.pods {
		if k != id {
			next.pods[k] = v
		}
	}
	for g, gr := range old.groups {
		if gr == p.group {
			next.used[g][p.slot] = false
		}
	}
	ix.reg.Store(next)
}

// Retain forgets every indexed pod for which keep returns false.
func (ix *Index) Retain(keep func(PodID) bool) {
	for id := range ix.reg.Load().pods {
		if !keep(id) {
			ix.Forget(id)
		}
	}
}

// Pods returns the indexed pods, in no particular order.
func (ix *Index) Pods() []PodID {
	pods := ix.reg.Load().pods
	out := make([]PodID, 0, len(pods))
	for id := range pods {
		out = append(out, id)
	}
	return out
}

// Stats describes the index's size.
type Stats struct {
	Pods int
	// Entries is the number of (pod, block) entries.
	Entries int
	// DistinctBlocks is the number of (group, block hash) holder records.
	DistinctBlocks int
	// TableBytes is the memory of the pods' tables (slots only).
	TableBytes int64
}

// Stats walks the index; it takes every lock in turn, so keep it off hot
// paths.
func (ix *Index) Stats() Stats {
	reg := ix.reg.Load()
	st := Stats{Pods: len(reg.pods)}
	for _, p := range reg.pods {
		p.mu.Lock()
		st.Entries += p.table.n
		st.TableBytes += int64(len(p.table.slots)) * 16
		p.mu.Unlock()
	}
	for _, g := range reg.groups {
		for i := range g.shards {
			s := &g.shards[i]
			s.mu.RLock()
			st.DistinctBlocks += len(s.holders)
			s.mu.RUnlock()
		}
	}
	return st
}

// scoreScratch is reused across Score calls.
// Route records that the request identified by requestID was sent to cand:
// the pod will hold the prompt's blocks, most recent first, evicting its
// least recently used ones. It returns the prediction made before
// recording, which ObserveUsage later checks against the server's report
// (requestID "" skips that). Route also counts the request as in flight on
// the pod until ObserveUsage or PendingTTL.
func (ix *Index) Route(now time.Time, requestID string, pr Prompt, cand Candidate) Routed {
	p := ix.lookup(cand.Pod, cand.Cache)
	if p == nil {
		return Routed{}
	}
	bt := int(p.blockTokens.Load())
	blockBytes := ix.cfg.Tokens.BlockBytes(bt)
	chain, length := pr.chain(nil, blockBytes, ix.maxBlocks(bt))

	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		return Routed{}
	}
	matched := 0
	for _, h := range chain {
		if !p.table.contains(h) {
			break
		}
		matched++
	}
	// Insert the tail first so that the prefix ends most recent: like the
	// server, evict a chain from its end.
	sharing := ix.inserts.on.Load()
	shared := p.shared[:0]
	for i := len(chain) - 1; i >= 0; i-- {
		if p.touchLocked(chain[i]) && sharing {
			shared = append(shared, chain[i])
		}
	}
	ix.inserts.logInserts(p.id, shared)
	p.shared = shared[:0]
	promptTokens := ix.cfg.Tokens.Tokens(length)
	p.cal.routed(float64(promptTokens), float64(ix.cfg.Tokens.Tokens(matched*blockBytes)))
	p.mu.Unlock()

	if requestID != "" {
		frac := 0.0
		if length > 0 {
			frac = math.Min(1, float64(matched*blockBytes)/float64(length))
		}
		if ix.pending.put(now, requestID, pendingEntry{pod: p, predicted: frac}) {
			p.inflight.Add(1)
		}
	}
	return Routed{MatchedBlocks: matched, TotalBlocks: len(chain)}
}

// InFlight returns how many requests Route sent to pod id that have not
// finished.
func (ix *Index) InFlight(id PodID) int {
	if p := ix.reg.Load().pods[id]; p != nil {
		return int(p.inflight.Load())
	}
	return 0
}

// Capacity returns the number of blocks pod id is currently modelled to
// keep (its calibrated effective capacity) and its nominal capacity.
func (ix *Index) Capacity(id PodID) (effective, nominal int) {
	p := ix.reg.Load().pods[id]
	if p == nil {
		return 0, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.table.limit, int(p.nominal.Load())
}

// Entries returns how many blocks pod id is believed to hold.
func (ix *Index) Entries(id PodID) int {
	p := ix.reg.Load().pods[id]
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.table.n
}
