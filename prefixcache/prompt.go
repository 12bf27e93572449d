package prefixcache

import (
	"sync"

	"github.com/cespare/xxhash/v2"
)

// ChatPrompt is the prompt of c as AppendChat renders it, hashed without
// being rendered: its strings are read in place, never joined or copied. c
// and the strings it refers to must not change while the prompt is in use;
// the index keeps neither. It fails only when c.Tools cannot be encoded as
// JSON.
func ChatPrompt(salt Salt, c Chat) (Prompt, error) {
	tools, err := encodeTools(c.Tools)
	if err != nil {
		return Prompt{}, err
	}
	return Prompt{Salt: salt, src: source{kind: sourceChat, chat: c, tools: tools}}, nil
}

// TextPrompt is the prompt AppendText renders from text, hashed without
// being rendered.
func TextPrompt(salt Salt, text string) Prompt {
	return Prompt{Salt: salt, src: source{kind: sourceText, text: text}}
}

// source is what ChatPrompt and TextPrompt keep to hash a rendering they
// never write out.
type source struct {
	kind  byte // 0: the prompt is Prompt.Rendered
	chat  Chat
	tools []byte
	text  string
}

const (
	sourceChat byte = 1 + iota
	sourceText
)

// Chains keeps one request's prompt chains, so that however many times the
// request is scored (Score, Peek) and routed (Route), its prompt is hashed
// once per block size: give the same Chains in every Prompt of that request
// (Prompt.Chains). It is keyed by the salt and the block size, so a prompt
// whose salt changes is hashed again. Safe for concurrent use; the zero value
// is empty and ready.
type Chains struct {
	mu      sync.Mutex
	entries []chainEntry
	w       chainWriter // reused for each chain hashed
}

type chainEntry struct {
	salt                  Salt
	blockBytes, maxBlocks int
	chain                 []uint64
	length                int
}

// Len returns how many chains c holds.
func (c *Chains) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// chain returns pr's chain of blockBytes blocks (at most maxBlocks) and the
// length of its rendering: from pr.Chains when it holds them (the slice is
// then shared: read it only), else hashed into dst (and kept in pr.Chains).
func (pr *Prompt) chain(dst []uint64, blockBytes, maxBlocks int) (chain []uint64, length int) {
	if pr.Chains == nil {
		return pr.hash(dst, blockBytes, maxBlocks)
	}
	c := pr.Chains
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.blockBytes == blockBytes && e.maxBlocks == maxBlocks && e.salt == pr.Salt {
			return e.chain, e.length
		}
	}
	chain, length = pr.hashWith(&c.w, nil, blockBytes, maxBlocks)
	c.w.chain = nil
	c.entries = append(c.entries, chainEntry{salt: pr.Salt, blockBytes: blockBytes, maxBlocks: maxBlocks, chain: chain, length: length})
	return chain, length
}

// hash appends pr's chain to dst (AppendChain of its rendering) and returns
// it with the rendering's length.
func (pr *Prompt) hash(dst []uint64, blockBytes, maxBlocks int) ([]uint64, int) {
	if pr.src.kind == 0 {
		return AppendChain(dst, pr.Salt, pr.Rendered, blockBytes, maxBlocks), len(pr.Rendered)
	}
	return pr.hashWith(&chainWriter{}, dst, blockBytes, maxBlocks)
}

// hashWith is hash with the chain writer w (reset first).
func (pr *Prompt) hashWith(w *chainWriter, dst []uint64, blockBytes, maxBlocks int) ([]uint64, int) {
	switch pr.src.kind {
	case sourceChat, sourceText:
		if dst == nil && blockBytes > 0 {
			// One allocation for the chain: its length is known from the rendering's, counted without hashing.
			dst = make([]uint64, 0, min(pr.renderedLen()/blockBytes, maxBlocks))
		}
		w.reset(dst, pr.Salt, blockBytes, maxBlocks)
		if pr.src.kind == sourceChat {
			renderChat(w, pr.src.chat, pr.src.tools)
		} else {
			renderText(w, pr.src.text)
		}
		return w.chain, w.n
	}
	return AppendChain(dst, pr.Salt, pr.Rendered, blockBytes, maxBlocks), len(pr.Rendered)
}

// renderedLen is the length of the prompt's rendering.
func (pr *Prompt) renderedLen() int {
	var n lenSink
	switch pr.src.kind {
	case sourceChat:
		renderChat(&n, pr.src.chat, pr.src.tools)
	case sourceText:
		renderText(&n, pr.src.text)
	default:
		return len(pr.Rendered)
	}
	return int(n)
}

// lenSink counts a rendering's bytes.
type lenSink int

func (n *lenSink) writeByte(byte)       { *n++ }
func (n *lenSink) writeString(s string) { *n += lenSink(len(s)) }

// chainWriter hashes a rendering written to it piece by piece into its
// chain (see AppendChain, which writes a whole rendering at once): it hashes
// the pieces where they lie and counts the rendering's bytes. It is the one
// definition of the chain.
type chainWriter struct {
	d          xxhash.Digest
	blockBytes int
	maxBlocks  int
	filled     int  // bytes of the current block hashed so far
	full       bool // maxBlocks blocks hashed (or none to hash): only count
	n          int
	chain      []uint64
}

func (w *chainWriter) reset(dst []uint64, salt Salt, blockBytes, maxBlocks int) {
	*w = chainWriter{blockBytes: blockBytes, maxBlocks: maxBlocks, chain: dst, full: blockBytes <= 0 || maxBlocks <= 0}
	w.d.ResetWithSeed(salt.seed())
}

func (w *chainWriter) writeByte(b byte) {
	var one [1]byte
	one[0] = b
	w.write(one[:])
}

func (w *chainWriter) writeString(s string) {
	w.n += len(s)
	for !w.full && len(s) > 0 {
		k := min(w.blockBytes-w.filled, len(s))
		_, _ = w.d.WriteString(s[:k])
		s = s[k:]
		w.endBlock(k)
	}
}

func (w *chainWriter) write(b []byte) {
	w.n += len(b)
	for !w.full && len(b) > 0 {
		k := min(w.blockBytes-w.filled, len(b))
		_, _ = w.d.Write(b[:k])
		b = b[k:]
		w.endBlock(k)
	}
}

// endBlock counts k more bytes of the current block and, when it is full,
// appends its hash and seeds the next block with it.
func (w *chainWriter) endBlock(k int) {
	if w.filled += k; w.filled < w.blockBytes {
		return
	}
	h := w.d.Sum64()
	if h == 0 {
		h = 1 // 0 marks an empty slot in the tables
	}
	w.chain = append(w.chain, h)
	w.filled = 0
	if len(w.chain) >= w.maxBlocks && w.maxBlocks > 0 {
		w.full = true
		return
	}
	w.d.ResetWithSeed(h)
}
