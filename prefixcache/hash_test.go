package prefixcache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
)

var testSalt = Salt{Model: "llama-3-8b"}

func chain(salt Salt, prompt []byte, blockBytes int) []uint64 {
	return AppendChain(nil, salt, prompt, blockBytes, 1<<20)
}

func TestChainSamePrefixSameHashes(t *testing.T) {
	a := AppendText(nil, strings.Repeat("shared system prompt. ", 20)+"question one")
	b := AppendText(nil, strings.Repeat("shared system prompt. ", 20)+"a different question")
	ca, cb := chain(testSalt, a, 16), chain(testSalt, b, 16)
	common := 0
	for common < len(a) && common < len(b) && a[common] == b[common] {
		common++
	}
	full := common / 16 // blocks entirely inside the common prefix
	if !slices.Equal(ca[:full], cb[:full]) {
		t.Fatalf("blocks inside the common prefix differ")
	}
	if ca[full] == cb[full] {
		t.Fatalf("block %d straddles the difference but hashes equal", full)
	}
	if !slices.Equal(chain(testSalt, a, 16), ca) {
		t.Fatalf("hashing is not deterministic")
	}
}

func TestChainEarlyChangeChangesAllLaterBlocks(t *testing.T) {
	a := AppendText(nil, strings.Repeat("x", 640))
	b := bytes.Clone(a)
	b[5] = 'y' // inside block 0
	ca, cb := chain(testSalt, a, 64), chain(testSalt, b, 64)
	if len(ca) != 10 || len(cb) != 10 {
		t.Fatalf("got %d and %d blocks, want 10", len(ca), len(cb))
	}
	for i := range ca {
		if ca[i] == cb[i] {
			t.Fatalf("block %d unchanged after a change in block 0", i)
		}
	}
}

func TestChainSaltIsolates(t *testing.T) {
	p := AppendText(nil, strings.Repeat("same prompt ", 40))
	base := chain(testSalt, p, 32)
	for _, s := range []Salt{
		{Model: "other-model"},
		{Model: testSalt.Model, Adapter: "sql-lora"},
		{Model: testSalt.Model, CacheSalt: "tenant-a"},
		{Model: testSalt.Model + "x"},
		{Model: "llama-3-8", Adapter: "b"}, // field boundaries matter
	} {
		c := chain(s, p, 32)
		for i := range c {
			if c[i] == base[i] {
				t.Fatalf("salt %+v shares block %d with %+v", s, i, testSalt)
			}
		}
	}
}

func TestChainFullBlocksOnlyAndCapped(t *testing.T) {
	p := make([]byte, 100)
	if got := len(chain(testSalt, p, 32)); got != 3 {
		t.Fatalf("100 bytes in 32-byte blocks: %d hashes, want 3", got)
	}
	if got := len(AppendChain(nil, testSalt, p, 32, 2)); got != 2 {
		t.Fatalf("capped at 2 blocks: %d hashes", got)
	}
	if got := len(chain(testSalt, p[:31], 32)); got != 0 {
		t.Fatalf("short prompt: %d hashes, want 0", got)
	}
	if got := len(chain(testSalt, p, 0)); got != 0 {
		t.Fatalf("zero block size: %d hashes, want 0", got)
	}
	for _, h := range chain(testSalt, p, 1) {
		if h == 0 {
			t.Fatal("hash 0 is reserved")
		}
	}
}

func TestTokenRule(t *testing.T) {
	r := TokenRule{BytesPerToken: 4}
	if r.BlockBytes(16) != 64 || r.Tokens(64) != 16 {
		t.Fatalf("4 bytes/token: BlockBytes(16)=%d Tokens(64)=%d", r.BlockBytes(16), r.Tokens(64))
	}
	r = TokenRule{BytesPerToken: 3.5}
	if r.BlockBytes(16) != 56 {
		t.Fatalf("3.5 bytes/token: BlockBytes(16)=%d, want 56", r.BlockBytes(16))
	}
	if (TokenRule{BytesPerToken: 0.01}).BlockBytes(1) != 1 {
		t.Fatal("BlockBytes must be at least 1")
	}
}

func msg(role, text string) Message {
	return Message{Role: role, Parts: []Part{{Kind: "text", Value: text}}}
}

func TestChatHistorySharesPrefix(t *testing.T) {
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "search", "parameters": map[string]any{"b": 1, "a": 2}}}}
	turn1 := Chat{Tools: tools, Messages: []Message{msg("system", "You are terse."), msg("user", "What is a KV cache?")}}
	turn2 := Chat{Tools: tools, Messages: append(slices.Clone(turn1.Messages), msg("assistant", "Stored attention keys and values."), msg("user", "And prefix caching?"))}
	r1, err := AppendChat(nil, turn1)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := AppendChat(nil, turn2)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(r2, r1) {
		t.Fatal("second turn's rendering does not extend the first's")
	}
	c1, c2 := chain(testSalt, r1, 8), chain(testSalt, r2, 8)
	if len(c1) == 0 || !slices.Equal(c2[:len(c1)], c1) {
		t.Fatal("second turn does not share the first turn's blocks")
	}
}

func TestChatOrderAndStructureMatter(t *testing.T) {
	a, b := msg("user", "first message here"), msg("user", "second message here")
	render := func(c Chat) []byte {
		r, err := AppendChat(nil, c)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ab := render(Chat{Messages: []Message{a, b}})
	cases := map[string][]byte{
		"swapped messages": render(Chat{Messages: []Message{b, a}}),
		"other role":       render(Chat{Messages: []Message{msg("system", "first message here"), b}}),
		"merged text":      render(Chat{Messages: []Message{msg("user", "first message heresecond message here")}}),
		"with tools":       render(Chat{Tools: []any{"t"}, Messages: []Message{a, b}}),
		"completion":       AppendText(nil, "first message heresecond message here"),
	}
	for name, r := range cases {
		if bytes.Equal(r, ab) {
			t.Errorf("%s renders like the original", name)
		}
		// From the first differing block on, no hash is shared.
		if c, o := chain(testSalt, r, 4), chain(testSalt, ab, 4); c[len(c)-1] == o[len(o)-1] {
			t.Errorf("%s shares the last block", name)
		}
	}
	// Map key order is canonical.
	x := render(Chat{Tools: map[string]any{"a": 1, "b": 2}})
	y := render(Chat{Tools: map[string]any{"b": 2, "a": 1}})
	if !bytes.Equal(x, y) {
		t.Error("tools rendering depends on map order")
	}
	if _, err := AppendChat(nil, Chat{Tools: func() {}}); err == nil {
		t.Error("unencodable tools accepted")
	}
}

// decodeChat inverts AppendChat for tools given as a JSON string value; it
// proves the rendering injective in the fuzz target.
func decodeChat(b []byte) (tools []byte, msgs []Message, err error) {
	bad := errors.New("malformed rendering")
	if len(b) == 0 || b[0] != domainChat {
		return nil, nil, bad
	}
	b = b[1:]
	str := func() (string, error) {
		n, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < n {
			return "", bad
		}
		s := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return s, nil
	}
	if len(b) > 0 && b[0] == tagTools {
		b = b[1:]
		s, err := str()
		if err != nil {
			return nil, nil, err
		}
		tools = []byte(s)
	}
	for len(b) > 0 {
		if b[0] != tagMessage {
			return nil, nil, bad
		}
		b = b[1:]
		role, err := str()
		if err != nil {
			return nil, nil, err
		}
		n, k := binary.Uvarint(b)
		if k <= 0 {
			return nil, nil, bad
		}
		b = b[k:]
		m := Message{Role: role}
		for range n {
			kind, err := str()
			if err != nil {
				return nil, nil, err
			}
			val, err := str()
			if err != nil {
				return nil, nil, err
			}
			m.Parts = append(m.Parts, Part{Kind: kind, Value: val})
		}
		msgs = append(msgs, m)
	}
	return tools, msgs, nil
}

// fuzzChat builds a chat from fuzz input: fields separated by 0xff bytes.
func fuzzChat(data []byte, tools string) Chat {
	var c Chat
	if tools != "" {
		c.Tools = tools
	}
	fields := bytes.Split(data, []byte{0xff})
	for i := 0; i+2 < len(fields); i += 3 {
		m := Message{Role: string(fields[i])}
		if len(fields[i+1])%2 == 0 {
			m.Parts = append(m.Parts, Part{Kind: "text", Value: string(fields[i+2])})
		} else {
			m.Parts = append(m.Parts, Part{Kind: "image_url", Value: string(fields[i+1])}, Part{Kind: "text", Value: string(fields[i+2])})
		}
		c.Messages = append(c.Messages, m)
	}
	return c
}

func FuzzAppendChat(f *testing.F) {
	f.Add([]byte("system\xffx\xffbe brief\xffuser\xff\xffhello"), "[]", uint8(3))
	f.Add([]byte("a\xff\xff\xff"), "", uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, tools string, cut uint8) {
		c := fuzzChat(data, tools)
		r, err := AppendChat(nil, c)
		if err != nil {
			t.Fatalf("AppendChat: %v", err)
		}
		// Injective: the rendering decodes back to the chat.
		gotTools, msgs, err := decodeChat(r)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if c.Tools != nil {
			want, _ := AppendChat(nil, Chat{Tools: c.Tools})
			if w, _, _ := decodeChat(want); !bytes.Equal(gotTools, w) {
				t.Fatalf("tools %q, want %q", gotTools, w)
			}
		} else if gotTools != nil {
			t.Fatalf("tools %q from a chat without tools", gotTools)
		}
		if len(msgs) != len(c.Messages) {
			t.Fatalf("%d messages decoded, want %d", len(msgs), len(c.Messages))
		}
		for i := range msgs {
			if msgs[i].Role != c.Messages[i].Role || !slices.Equal(msgs[i].Parts, c.Messages[i].Parts) {
				t.Fatalf("message %d: %+v, want %+v", i, msgs[i], c.Messages[i])
			}
		}
		// Prefix-preserving, down to the hashes.
		k := int(cut) % (len(c.Messages) + 1)
		head, _ := AppendChat(nil, Chat{Tools: c.Tools, Messages: c.Messages[:k]})
		if !bytes.HasPrefix(r, head) {
			t.Fatalf("history of %d messages is not a prefix", k)
		}
		hc, rc := chain(testSalt, head, 7), chain(testSalt, r, 7)
		if !slices.Equal(rc[:len(hc)], hc) {
			t.Fatal("history's blocks are not shared")
		}
	})
}

func FuzzAppendChain(f *testing.F) {
	f.Add([]byte("hello world, this is a prompt"), []byte("hello world, that"), uint8(4), "m")
	f.Fuzz(func(t *testing.T, a, b []byte, blk uint8, model string) {
		bs := int(blk%64) + 1
		s := Salt{Model: model}
		ca, cb := chain(s, a, bs), chain(s, b, bs)
		if len(ca) != len(a)/bs {
			t.Fatalf("%d hashes for %d bytes in %d-byte blocks", len(ca), len(a), bs)
		}
		common := 0
		for common < len(a) && common < len(b) && a[common] == b[common] {
			common++
		}
		for i := range min(len(ca), len(cb)) {
			inside := (i+1)*bs <= common
			if inside != (ca[i] == cb[i]) {
				t.Fatalf("block %d: inside common prefix=%v but equal hashes=%v", i, inside, ca[i] == cb[i])
			}
			if ca[i] == 0 {
				t.Fatal("hash 0")
			}
		}
	})
}

// TestChainValues pins the chain's hashes: replicas exchange them (prefix inserts) and servers' caches are matched
// by them, so a change of the definition must be deliberate.
func TestChainValues(t *testing.T) {
	p := []byte("The quick brown fox jumps over the lazy dog, twice over: the quick brown fox.")
	tests := []struct {
		name                  string
		salt                  Salt
		blockBytes, maxBlocks int
		want                  []uint64
	}{
		{"salted, capped", Salt{Model: "m", Adapter: "a"}, 16, 3,
			[]uint64{0x4db9d933cbb585d7, 0xcdb7186b944a1bf, 0x3e21dd72e53e14d9}},
		{"unsalted, every full block", Salt{}, 7, 100,
			[]uint64{0xad410869b6ade641, 0x21497c42ec90c5, 0x2ee070a9abe1dd3d, 0x44aa474104d452fd, 0xfffa60680dbf975d,
				0x1c135470081793e3, 0x24d773f37cd34778, 0x31972159e8b03399, 0xf7ebc9899075559f, 0x24074e2d52e70239,
				0xbd1a800155f24cf5}},
		{"no block size", Salt{}, 0, 100, nil},
		{"no blocks allowed", Salt{}, 7, 0, nil},
	}
	for _, tc := range tests {
		if got := AppendChain(nil, tc.salt, p, tc.blockBytes, tc.maxBlocks); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %#v, want %#v", tc.name, got, tc.want)
		}
	}
}
