package prefixcache

import (
	"math"
	"math/bits"
)

// Score writes into scores[i] the prefix affinity of cands[i], in [0,1]:
// the fraction of the prompt's blocks the pod is predicted to hold
// (matching stops at the first block it lacks) times the load guard's
// weight (see GuardConfig). scores must be at least as long as cands.
// Unknown pods are registered; pods beyond MaxPods score 0. Each guard
// action on a matching pod is recorded (Recorder.IncGuard).
func (ix *Index) Score(pr Prompt, cands []Candidate, scores []float64) {
	ix.score(pr, cands, scores, true)
}

// Peek is Score without recording guard actions, for a caller that looks
// at the affinities before the scorer does (it would count them twice).
func (ix *Index) Peek(pr Prompt, cands []Candidate, scores []float64) {
	ix.score(pr, cands, scores, false)
}

// scoreScratch is one scoring call's working memory, pooled in
// Index.scratch so that scoring allocates nothing.
type scoreScratch struct {
	pods  []*pod
	match []int
	total []int
	load  []float64
	chain []uint64 // scratch for chains not kept in the prompt's Chains
	cur   []uint64 // the chain being matched
}

func (ix *Index) score(pr Prompt, cands []Candidate, scores []float64, record bool) {
	n := len(cands)
	sc := ix.scratch.Get().(*scoreScratch)
	defer ix.scratch.Put(sc)
	sc.pods = grow(sc.pods, n)
	sc.match = grow(sc.match, n)
	sc.total = grow(sc.total, n)
	sc.load = grow(sc.load, n)

	for i, c := range cands {
		p := ix.lookup(c.Pod, c.Cache)
		sc.pods[i] = p
		sc.match[i], sc.total[i] = 0, 0
		load := float64(c.Load.Queued + c.Load.Running)
		if p != nil {
			load = math.Max(load, float64(p.inflight.Load()))
		}
		sc.load[i] = load
	}

	// One chain per block size in the pool (usually one), one pass per
	// holder group (one per 64 pods).
	for i, p := range sc.pods {
		if p == nil || sc.total[i] != 0 {
			continue
		}
		bt := int(p.blockTokens.Load())
		chain, _ := pr.chain(sc.chain[:0], ix.cfg.Tokens.BlockBytes(bt), ix.maxBlocks(bt))
		if pr.Chains == nil {
			sc.chain = chain // keep the grown scratch
		}
		sc.cur = chain
		if len(chain) == 0 {
			sc.total[i] = -1
			continue
		}
		ix.matchGroups(sc, i, bt)
	}

	var mean float64
	for _, l := range sc.load[:n] {
		mean += l
	}
	if n > 0 {
		mean /= float64(n)
	}
	for i := range cands {
		scores[i] = 0
		if sc.total[i] <= 0 {
			continue
		}
		w, action := ix.cfg.Guard.weight(sc.load[i], mean, cands[i].Load.KVUtilization)
		if record && sc.match[i] > 0 && action != GuardNone {
			ix.rec.IncGuard(action)
		}
		scores[i] = float64(sc.match[i]) / float64(sc.total[i]) * w
	}
	for i := range sc.pods[:n] {
		sc.pods[i] = nil // do not keep pods alive from the pool
	}
	sc.cur = nil
}

// matchGroups computes the match of every candidate from first on whose
// block size is bt, against sc.cur, and marks them done (total set).
func (ix *Index) matchGroups(sc *scoreScratch, first, bt int) {
	for {
		// Candidates of one group: bit → candidate.
		var g *group
		var alive uint64
		var byBit [groupPods]int32
		var dup []int // candidates naming a pod already in this pass
		for i := first; i < len(sc.pods); i++ {
			p := sc.pods[i]
			if p == nil || sc.total[i] != 0 || int(p.blockTokens.Load()) != bt {
				continue
			}
			if g == nil {
				g = p.group
			}
			if p.group != g {
				continue
			}
			if alive&p.bit != 0 {
				dup = append(dup, i)
				continue
			}
			alive |= p.bit
			byBit[p.slot] = int32(i)
			sc.total[i] = len(sc.cur)
		}
		if g == nil {
			return
		}
		for k, h := range sc.cur {
			held := g.held(h) & alive
			for dead := alive &^ held; dead != 0; dead &= dead - 1 {
				sc.match[byBit[bits.TrailingZeros64(dead)]] = k
			}
			if alive = held; alive == 0 {
				break
			}
		}
		for ; alive != 0; alive &= alive - 1 {
			sc.match[byBit[bits.TrailingZeros64(alive)]] = len(sc.cur)
		}
		for _, i := range dup {
			sc.match[i] = sc.match[byBit[sc.pods[i].slot]]
			sc.total[i] = len(sc.cur)
		}
	}
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
