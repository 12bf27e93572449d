package engine

// kvCache is the paged KV cache with automatic prefix caching, after vLLM
// v1's KVCacheManager/BlockPool:
//   - every block has a reference count; a block is free when it is 0;
//   - free blocks sit in one LRU queue (evict from the head, free to the
//     tail); a free block may still hold a cached prefix (it has a hash and
//     is in byHash) until it is handed out again, which evicts it;
//   - a request frees its blocks in reverse order, so a prompt's tail is
//     evicted before its head, which other requests are likelier to share.
//
// Invariant: numFree == number of blocks with ref == 0 == length of the free
// queue; byHash[h] == b if and only if hashed[b] and hash[b] == h.
type kvCache struct {
	blockSize int
	ref       []int32
	hash      []uint64
	hashed    []bool
	prev      []int32 // free-queue links, -1 terminates
	next      []int32
	head      int32
	tail      int32
	numFree   int
	byHash    map[uint64]int32
	caching   bool
	hits      []int32 // scratch for lookup, reused
}

func newKVCache(numBlocks, blockSize int, caching bool) *kvCache {
	kv := &kvCache{
		blockSize: blockSize,
		ref:       make([]int32, numBlocks),
		hash:      make([]uint64, numBlocks),
		hashed:    make([]bool, numBlocks),
		prev:      make([]int32, numBlocks),
		next:      make([]int32, numBlocks),
		head:      -1,
		tail:      -1,
		byHash:    make(map[uint64]int32),
		caching:   caching,
	}
	for b := range numBlocks {
		kv.pushTail(int32(b))
	}
	return kv
}

func (kv *kvCache) numBlocks() int { return len(kv.ref) }

func (kv *kvCache) pushTail(b int32) {
	kv.prev[b], kv.next[b] = kv.tail, -1
	if kv.tail >= 0 {
		kv.next[kv.tail] = b
	} else {
		kv.head = b
	}
	kv.tail = b
	kv.numFree++
}

func (kv *kvCache) unlink(b int32) {
	p, n := kv.prev[b], kv.next[b]
	if p >= 0 {
		kv.next[p] = n
	} else {
		kv.head = n
	}
	if n >= 0 {
		kv.prev[n] = p
	} else {
		kv.tail = p
	}
	kv.numFree--
}

// popFree hands out the least recently freed block, evicting the prefix it
// caches. The caller has checked numFree > 0.
func (kv *kvCache) popFree() int32 {
	b := kv.head
	kv.unlink(b)
	if kv.hashed[b] { // only blocks that own their hash's entry are marked hashed
		delete(kv.byHash, kv.hash[b])
		kv.hashed[b] = false
	}
	kv.ref[b] = 1
	return b
}

// lookup finds the longest cached prefix of r among its first maxBlocks block
// hashes, without changing anything. It returns the hit blocks (valid until
// the next lookup) and how many of them are free, since taking those shrinks
// what is left for new blocks.
func (kv *kvCache) lookup(hashes []uint64, maxBlocks int) (hits []int32, free int) {
	kv.hits = kv.hits[:0]
	if !kv.caching {
		return kv.hits, 0
	}
	for _, h := range hashes[:min(maxBlocks, len(hashes))] {
		b, ok := kv.byHash[h]
		if !ok {
			break
		}
		kv.hits = append(kv.hits, b)
		if kv.ref[b] == 0 {
			free++
		}
	}
	return kv.hits, free
}

// take adds one reference to each hit block.
func (kv *kvCache) take(r *Request, hits []int32) {
	for _, b := range hits {
		if kv.ref[b] == 0 {
			kv.unlink(b)
		}
		kv.ref[b]++
		r.blocks = append(r.blocks, b)
	}
	r.numHashed = len(hits)
}

// blocksFor is the number of blocks that hold tokens tokens.
func (kv *kvCache) blocksFor(tokens int) int {
	return (tokens + kv.blockSize - 1) / kv.blockSize
}

// grow gives r enough blocks to hold tokens tokens, or reports false and
// changes nothing when there are too few free blocks.
func (kv *kvCache) grow(r *Request, tokens int) bool {
	need := kv.blocksFor(tokens) - len(r.blocks)
	if need <= 0 {
		return true
	}
	if need > kv.numFree {
		return false
	}
	for range need {
		r.blocks = append(r.blocks, kv.popFree())
	}
	return true
}

// register publishes r's newly full prompt blocks in the prefix cache. A hash
// that is already cached (two requests computed the same prefix at once)
// keeps its first block, as in vLLM.
func (kv *kvCache) register(r *Request) {
	if !kv.caching {
		return
	}
	full := min(r.computed/kv.blockSize, len(r.BlockHashes), len(r.blocks))
	for i := r.numHashed; i < full; i++ {
		b, h := r.blocks[i], r.BlockHashes[i]
		if _, ok := kv.byHash[h]; !ok && !kv.hashed[b] {
			kv.byHash[h] = b
			kv.hash[b] = h
			kv.hashed[b] = true
		}
	}
	if full > r.numHashed {
		r.numHashed = full
	}
}

// release drops r's references, tail block first.
func (kv *kvCache) release(r *Request) {
	for i := len(r.blocks) - 1; i >= 0; i-- {
		b := r.blocks[i]
		kv.ref[b]--
		if kv.ref[b] == 0 {
			kv.pushTail(b)
		}
	}
	r.blocks = r.blocks[:0]
	r.numHashed = 0
}

// usage is the fraction of blocks referenced by requests; cached free blocks
// count as free, as in vLLM's kv_cache_usage_perc.
func (kv *kvCache) usage() float64 {
	return float64(len(kv.ref)-kv.numFree) / float64(len(kv.ref))
}
