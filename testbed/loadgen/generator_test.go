package loadgen

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

func mustMix(t testing.TB, y string) *Mix {
	t.Helper()
	m, err := ParseMix([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type sentBody struct {
	Model    string        `json:"model"`
	Messages []chatMessage `json:"messages"`
	Prompt   string        `json:"prompt"`
	Max      int           `json:"max_tokens"`
	Stream   bool          `json:"stream"`
}

func decodeBody(t *testing.T, b []byte) sentBody {
	t.Helper()
	var s sentBody
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

const weightedMix = `
classes:
  - {name: a, weight: 3, model: m, prompt_tokens: 10, output_tokens: 5}
  - {name: b, weight: 1, model: m, lora: adapter-1, objective: critical, tenant: t1, prompt_tokens: {min: 5, max: 9}, output_tokens: 7, api: completions, stream: false}
  - {name: never, weight: 0, model: m, prompt_tokens: 1, output_tokens: 1}
`

func TestGeneratorDeterministic(t *testing.T) {
	m := mustMix(t, weightedMix)
	g1, g2, g3 := NewGenerator(m, 11), NewGenerator(m, 11), NewGenerator(m, 12)
	differs := false
	for range 200 {
		a, b, c := g1.Next(), g2.Next(), g3.Next()
		if a.Class != b.Class || string(a.Body) != string(b.Body) || a.Seq != b.Seq {
			t.Fatalf("same seed diverged at seq %d", a.Seq)
		}
		differs = differs || string(a.Body) != string(c.Body)
	}
	if !differs {
		t.Error("different seeds produced identical sequences")
	}
}

func TestGeneratorClassesAndFields(t *testing.T) {
	m := mustMix(t, weightedMix)
	g := NewGenerator(m, 5)
	counts := map[string]int{}
	const n = 20000
	for i := range n {
		s := g.Next()
		if s.Seq != i {
			t.Fatalf("seq %d, want %d", s.Seq, i)
		}
		counts[s.Class]++
		if i >= 2000 {
			// Counting suffices for the share check; decoding every body
			// under -race is slow.
			continue
		}
		body := decodeBody(t, s.Body)
		switch s.Class {
		case "a":
			if s.API != APIChat || !s.Stream || body.Model != "m" || len(body.Messages) != 1 || body.Max != 5 {
				t.Fatalf("class a request %+v body %+v", s, body)
			}
			if got := len(body.Messages[0].Content); got != 10*CharsPerToken || s.PromptTokens != 10 {
				t.Fatalf("class a prompt is %d chars / %d tokens, want %d / 10", got, s.PromptTokens, 10*CharsPerToken)
			}
		case "b":
			if s.API != APICompletions || s.Stream || body.Model != "adapter-1" || s.Model != "adapter-1" || body.Prompt == "" || body.Max != 7 {
				t.Fatalf("class b request %+v body %+v", s, body)
			}
			if s.PromptTokens < 5 || s.PromptTokens > 9 {
				t.Fatalf("class b prompt tokens %d outside 5..9", s.PromptTokens)
			}
			if s.Headers[ObjectiveHeader] != "critical" || s.Headers[TenantHeader] != "t1" {
				t.Fatalf("class b headers %v", s.Headers)
			}
		default:
			t.Fatalf("zero-weight class %q was generated", s.Class)
		}
	}
	if share := float64(counts["a"]) / n; math.Abs(share-0.75) > 0.015 {
		t.Errorf("class a share %.3f, want 0.75", share)
	}
}

func TestSharedPrefixGroups(t *testing.T) {
	m := mustMix(t, `
classes:
  - name: p
    model: m
    prompt_tokens: 8
    output_tokens: 4
    shared_prefix: {groups: 4, tokens: 32, zipf_s: 1.2}
`)
	g := NewGenerator(m, 3)
	prefixOf := map[int]string{}
	counts := make([]int, 4)
	const n = 20000
	for i := range n {
		s := g.Next()
		counts[s.PrefixGroup]++
		if i >= 2000 {
			continue
		}
		body := decodeBody(t, s.Body)
		if len(body.Messages) != 2 || body.Messages[0].Role != "system" {
			t.Fatalf("messages %+v", body.Messages)
		}
		sys := body.Messages[0].Content
		if len(sys) != 32*CharsPerToken {
			t.Fatalf("prefix of %d chars, want %d", len(sys), 32*CharsPerToken)
		}
		if prev, ok := prefixOf[s.PrefixGroup]; ok && prev != sys {
			t.Fatalf("group %d has two different prefixes", s.PrefixGroup)
		}
		prefixOf[s.PrefixGroup] = sys
		if s.PromptTokens != 40 {
			t.Fatalf("prompt tokens %d, want 32+8", s.PromptTokens)
		}
	}
	seen := map[string]bool{}
	for _, p := range prefixOf {
		if seen[p] {
			t.Fatal("two groups share a prefix")
		}
		seen[p] = true
	}
	z := newZipf(4, 1.2)
	for k, c := range counts {
		if got, want := float64(c)/n, z.probability(k); math.Abs(got-want) > 0.015 {
			t.Errorf("group %d frequency %.3f, want Zipf probability %.3f", k, got, want)
		}
	}
	// The prefix text does not depend on request order: another seed-equal
	// generator that reaches group 0 later still produces the same text.
	g2 := NewGenerator(m, 3)
	if got := g2.prefix(0, 0); got != prefixOf[0] {
		t.Error("prefix of group 0 depends on the request order")
	}
}

func TestZipfUniformAndSkewed(t *testing.T) {
	u := newZipf(5, 0)
	for k := range 5 {
		if math.Abs(u.probability(k)-0.2) > 1e-12 {
			t.Fatalf("s=0: P(%d)=%v, want uniform", k, u.probability(k))
		}
	}
	z := newZipf(100, 1)
	for k := 1; k < 100; k++ {
		if z.probability(k) >= z.probability(k-1) {
			t.Fatalf("s=1: P(%d) >= P(%d)", k, k-1)
		}
	}
	if r := z.probability(0) / z.probability(9); math.Abs(r-10) > 1e-9 {
		t.Errorf("s=1: P(0)/P(9) = %v, want 10", r)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		if k := z.sample(rng); k < 0 || k >= 100 {
			t.Fatalf("sample %d out of range", k)
		}
	}
}

func TestMultiTurnChats(t *testing.T) {
	m := mustMix(t, `
classes:
  - name: chat
    model: m
    prompt_tokens: 6
    output_tokens: 3
    shared_prefix: {groups: 2, tokens: 5}
    multi_turn: {turns: 3, concurrent: 2}
`)
	g := NewGenerator(m, 9)
	history := map[int][]chatMessage{} // chat -> messages of its last request
	turns := map[int]int{}
	for range 300 {
		s := g.Next()
		if s.ChatID < 0 || s.Turn < 1 || s.Turn > 3 {
			t.Fatalf("chat %d turn %d", s.ChatID, s.Turn)
		}
		if s.Turn != turns[s.ChatID]+1 {
			t.Fatalf("chat %d jumped from turn %d to %d", s.ChatID, turns[s.ChatID], s.Turn)
		}
		turns[s.ChatID] = s.Turn
		msgs := decodeBody(t, s.Body).Messages
		// system + turn user messages + (turn-1) assistant replies.
		if want := 1 + 2*s.Turn - 1; len(msgs) != want {
			t.Fatalf("turn %d has %d messages, want %d", s.Turn, len(msgs), want)
		}
		if prev, ok := history[s.ChatID]; ok {
			for i, pm := range prev {
				if msgs[i] != pm {
					t.Fatalf("chat %d turn %d does not resend its history", s.ChatID, s.Turn)
				}
			}
			if msgs[len(prev)].Role != "assistant" || len(msgs[len(prev)].Content) != 3*CharsPerToken {
				t.Fatalf("missing synthetic assistant reply of the output length")
			}
		}
		history[s.ChatID] = msgs
		wantTokens := 0
		for _, mm := range msgs {
			wantTokens += len(mm.Content)
		}
		if s.PromptTokens != wantTokens/CharsPerToken {
			t.Fatalf("prompt tokens %d, want %d", s.PromptTokens, wantTokens/CharsPerToken)
		}
	}
	for id, n := range turns {
		// Chats still open at the end may be short; finished ones had 3.
		if n > 3 {
			t.Errorf("chat %d had %d turns", id, n)
		}
	}
}

func TestEstimateTokens(t *testing.T) {
	for _, tc := range []struct {
		text string
		want int
	}{{"", 0}, {"a", 1}, {"abcd", 1}, {"abcde", 2}, {strings.Repeat("x", 400), 100}} {
		if got := EstimateTokens(tc.text); got != tc.want {
			t.Errorf("EstimateTokens(%d chars) = %d, want %d", len(tc.text), got, tc.want)
		}
	}
}

func TestRealisticPiecesAreOneTokenEach(t *testing.T) {
	for i, piece := range realisticPieces {
		filled := strings.ReplaceAll(piece, "_", "x")
		if len(filled) != CharsPerToken || !utf8.ValidString(filled) {
			t.Errorf("piece %d %q: %d bytes (valid UTF-8: %v), want %d", i, piece, len(filled), utf8.ValidString(filled), CharsPerToken)
		}
	}
}

// TestPromptTextKeepsTheRequests holds the two texts to the same requests: the same classes, lengths, headers and
// byte counts of text, seed for seed, so that a scenario written as realistic text differs from its words twin only
// in what its prompts say.
func TestPromptTextKeepsTheRequests(t *testing.T) {
	const mixes = `
classes:
  - {name: long, model: m, prompt_tokens: {min: 400, max: 600}, output_tokens: {min: 4, max: 64}}
  - {name: prefixed, model: m, prompt_tokens: {min: 10, max: 90}, output_tokens: 8, shared_prefix: {groups: 4, tokens: 100, zipf_s: 1}}
  - {name: chat, model: m, prompt_tokens: {min: 10, max: 90}, output_tokens: 8, multi_turn: {turns: 3, concurrent: 2}}
  - {name: text, model: m, api: completions, prompt_tokens: {min: 10, max: 90}, output_tokens: 8}
`
	words := mustMix(t, mixes)
	realistic := mustMix(t, "prompt_text: realistic\n"+mixes)
	for _, seed := range []uint64{1, 7, 42} {
		gw, gr := NewGenerator(words, seed), NewGenerator(realistic, seed)
		for range 300 {
			w, r := gw.Next(), gr.Next()
			if w.Class != r.Class || w.PromptTokens != r.PromptTokens || w.MaxTokens != r.MaxTokens ||
				w.PrefixGroup != r.PrefixGroup || w.ChatID != r.ChatID || w.Turn != r.Turn {
				t.Fatalf("seed %d, seq %d: realistic request %s, words request %s", seed, w.Seq, requestShape(r), requestShape(w))
			}
			ws, rs := promptOf(t, w), promptOf(t, r)
			if len(ws) != len(rs) || !utf8.ValidString(rs) {
				t.Fatalf("seed %d, seq %d: realistic text of %d bytes (valid UTF-8: %v), words %d", seed, w.Seq, len(rs), utf8.ValidString(rs), len(ws))
			}
		}
	}
}

func requestShape(s RequestSpec) string {
	return fmt.Sprintf("{class %s, prompt %d, max %d, group %d, chat %d turn %d}", s.Class, s.PromptTokens, s.MaxTokens, s.PrefixGroup, s.ChatID, s.Turn)
}

// promptOf is the text a request carries, its messages' contents joined.
func promptOf(t *testing.T, spec RequestSpec) string {
	t.Helper()
	var s sentBody
	if err := json.Unmarshal(spec.Body, &s); err != nil {
		t.Fatal(err)
	}
	text := s.Prompt
	for _, m := range s.Messages {
		text += m.Content
	}
	return text
}

// TestRealisticTextIsWrittenAsPrompts checks that a long realistic prompt's JSON carries what real ones do and the
// words never do: escapes (\n, \t, \", \\) and non-ASCII characters, each more than rarely, with a line break
// about every 45 bytes.
func TestRealisticTextIsWrittenAsPrompts(t *testing.T) {
	m := mustMix(t, "prompt_text: realistic\nclasses:\n  - {name: long, model: m, prompt_tokens: 50000, output_tokens: 64}\n")
	spec := NewGenerator(m, 1).Next()
	text := promptOf(t, spec)
	for _, want := range []string{`\n`, `\t`, `\"`, `\\`} {
		if n := strings.Count(string(spec.Body), want); n < 500 {
			t.Errorf("%s appears %d times in a 200 KB body, want hundreds", want, n)
		}
	}
	for _, want := range []string{"é", "€", "—", "🙂", "<", "&"} {
		if n := strings.Count(text, want); n < 100 {
			t.Errorf("%s appears %d times in a 200 KB prompt, want hundreds", want, n)
		}
	}
	if lines := strings.Count(text, "\n"); len(text)/lines < 30 || len(text)/lines > 80 {
		t.Errorf("a line break every %d bytes, want about 45", len(text)/lines)
	}
	plain := NewGenerator(mustMix(t, "classes:\n  - {name: long, model: m, prompt_tokens: 50000, output_tokens: 64}\n"), 1).Next()
	if strings.Contains(string(plain.Body), `\`) || !isASCII(promptOf(t, plain)) {
		t.Error("the words text carries an escape or a non-ASCII byte")
	}
}

func isASCII(s string) bool {
	for i := range len(s) {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
