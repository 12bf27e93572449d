package prefixcache

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestPromptHashesAsRendered: a prompt built by ChatPrompt or TextPrompt
// hashes (without rendering) to the chain and length of its rendering, for
// block sizes that split every piece, and under every block limit.
func TestPromptHashesAsRendered(t *testing.T) {
	long := strings.Repeat("the quick brown fox ", 500)
	chats := map[string]Chat{
		"empty":      {},
		"one":        {Messages: []Message{{Role: "user", Parts: []Part{{Kind: "text", Value: "hello"}}}}},
		"tools":      {Tools: []any{map[string]any{"b": 1, "a": "x"}}, Messages: []Message{{Role: "user", Parts: []Part{{Kind: "text", Value: long}}}}},
		"multi-part": {Messages: []Message{{Role: "system", Parts: []Part{{Kind: "text", Value: long[:300]}}}, {Role: "user", Parts: []Part{{Kind: "image_url", Value: "http://x/y.png"}, {Kind: "text", Value: long}}}}},
		"long role":  {Messages: []Message{{Role: long[:200], Parts: nil}}},
	}
	type promptCase struct {
		pr       Prompt
		rendered []byte
	}
	cases := map[string]promptCase{}
	for name, c := range chats {
		pr, err := ChatPrompt(testSalt, c)
		if err != nil {
			t.Fatal(err)
		}
		r, _ := AppendChat(nil, c)
		cases["chat/"+name] = promptCase{pr, r}
	}
	for _, text := range []string{"", "x", long} {
		cases[fmt.Sprintf("text/%d", len(text))] = promptCase{TextPrompt(testSalt, text), AppendText(nil, text)}
	}
	for name, tc := range cases {
		for _, bs := range []int{1, 3, 7, 64, 1000, 1 << 20} {
			for _, maxBlocks := range []int{0, 1, 2, 5, 1 << 30} {
				want := AppendChain(nil, testSalt, tc.rendered, bs, maxBlocks)
				got, n := tc.pr.hash(nil, bs, maxBlocks)
				if !slices.Equal(got, want) || n != len(tc.rendered) {
					t.Errorf("%s, %d-byte blocks, at most %d: %d hashes, length %d; want %d hashes (equal: %v), length %d",
						name, bs, maxBlocks, len(got), n, len(want), slices.Equal(got, want), len(tc.rendered))
				}
			}
		}
	}
	if _, err := ChatPrompt(testSalt, Chat{Tools: func() {}}); err == nil {
		t.Error("ChatPrompt encoded a function as tools")
	}
}

// TestChainsHashOncePerBlockSize: with Chains, a request's scoring and its
// insert share one chain per salt and block size; the figures are those of
// the rendered prompt.
func TestChainsHashOncePerBlockSize(t *testing.T) {
	cfg := DefaultConfig()
	chat := Chat{Messages: []Message{{Role: "user", Parts: []Part{{Kind: "text", Value: strings.Repeat("prompt ", 400)}}}}}
	rendered, _ := AppendChat(nil, chat)
	cands := []Candidate{
		{Pod: PodID{Namespace: "ns", Name: "a"}, Cache: CacheInfo{NumBlocks: 1000, BlockTokens: 16}},
		{Pod: PodID{Namespace: "ns", Name: "b"}, Cache: CacheInfo{NumBlocks: 1000, BlockTokens: 16}},
		{Pod: PodID{Namespace: "ns", Name: "c"}, Cache: CacheInfo{NumBlocks: 1000, BlockTokens: 32}},
	}
	now := time.Unix(0, 0)

	// The same decisions, once with the rendered prompt, once hashed in place with shared chains.
	var results [2][]string
	var chains Chains
	for k := range 2 {
		ix, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		pr := Prompt{Salt: testSalt, Rendered: rendered}
		if k == 1 {
			pr, _ = ChatPrompt(testSalt, chat)
			pr.Chains = &chains
		}
		scores := make([]float64, len(cands))
		for round := range 3 {
			ix.Score(pr, cands, scores)
			routed := ix.Route(now, fmt.Sprint("r", round), pr, cands[round%len(cands)])
			results[k] = append(results[k], fmt.Sprint(scores, routed))
		}
	}
	if !slices.Equal(results[0], results[1]) {
		t.Errorf("hashed in place with chains: %v\nrendered: %v", results[1], results[0])
	}
	if chains.Len() != 2 {
		t.Errorf("%d chains kept, want one per block size (2)", chains.Len())
	}
	pr, _ := ChatPrompt(testSalt, chat)
	pr.Chains = &chains
	a, _ := pr.chain(nil, 64, 100)
	b, _ := pr.chain(nil, 64, 100)
	if &a[0] != &b[0] {
		t.Error("the second call hashed the prompt again")
	}
	kept := chains.Len()
	pr.Salt.Model = "other"
	if c, _ := pr.chain(nil, 64, 100); slices.Equal(c, a) || chains.Len() != kept+1 {
		t.Errorf("another salt reused a chain (%d kept)", chains.Len())
	}
}

func FuzzChatPrompt(f *testing.F) {
	f.Add([]byte("system\xffx\xffbe brief\xffuser\xff\xffhello"), "[]", uint8(3), uint8(9))
	f.Add([]byte("a\xff\xff\xff"), "", uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, tools string, blk, limit uint8) {
		c := fuzzChat(data, tools)
		pr, err := ChatPrompt(testSalt, c)
		if err != nil {
			t.Fatalf("ChatPrompt: %v", err)
		}
		r, _ := AppendChat(nil, c)
		bs, maxBlocks := int(blk%64)+1, int(limit)
		want := AppendChain(nil, testSalt, r, bs, maxBlocks)
		got, n := pr.hash(nil, bs, maxBlocks)
		if !slices.Equal(got, want) || n != len(r) {
			t.Fatalf("%d-byte blocks, at most %d: %v (length %d), want %v (length %d)", bs, maxBlocks, got, n, want, len(r))
		}
	})
}
