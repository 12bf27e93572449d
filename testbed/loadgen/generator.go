package loadgen

import (
	"bytes"
	"encoding/json"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
)

// CharsPerToken is the text-to-token rule used everywhere in loadgen: one
// token is about 4 characters of English text (OpenAI's rule of thumb).
// Synthetic text is built from 3-letter words plus a space, so N tokens are
// exactly 4N characters.
const CharsPerToken = 4

// EstimateTokens applies the CharsPerToken rule to text (rounding up).
func EstimateTokens(text string) int {
	return (len(text) + CharsPerToken - 1) / CharsPerToken
}

// syntheticText returns tokens pseudo-words of 3 lower-case letters, each
// followed by a space: 4*tokens characters.
func syntheticText(rng *rand.Rand, tokens int) string {
	var b strings.Builder
	b.Grow(tokens * CharsPerToken)
	var word [CharsPerToken]byte
	word[CharsPerToken-1] = ' '
	for range tokens {
		// One draw per word picks all three letters.
		v := rng.Uint32N(26 * 26 * 26)
		for i := range CharsPerToken - 1 {
			word[i] = byte('a' + v%26)
			v /= 26
		}
		b.Write(word[:])
	}
	return b.String()
}

// RequestSpec is one generated request, fully determined by the mix, the
// seed and its sequence number.
type RequestSpec struct {
	Seq   int    `json:"seq"`
	Class string `json:"class"`
	API   API    `json:"api"`
	// Model is the model field sent (the LoRA adapter when the class has one).
	Model  string `json:"model"`
	Stream bool   `json:"stream"`
	// Headers are sent in addition to Content-Type.
	Headers map[string]string `json:"headers,omitempty"`
	Body    []byte            `json:"-"`
	// PromptTokens estimates the whole prompt (prefix, history and new
	// text) by the CharsPerToken rule.
	PromptTokens int `json:"prompt_tokens"`
	MaxTokens    int `json:"max_tokens"`
	// PrefixGroup is the shared-prefix group, or -1.
	PrefixGroup int `json:"prefix_group"`
	// ChatID identifies the chat of a multi-turn class (-1 otherwise); Turn
	// counts from 1.
	ChatID int `json:"chat_id"`
	Turn   int `json:"turn"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatState struct {
	id       int
	turn     int
	group    int
	messages []chatMessage
}

// Generator produces a deterministic sequence of requests from a mix and a
// seed. It is not safe for concurrent use; the runner serialises calls.
type Generator struct {
	mix      *Mix
	seed     uint64
	rng      *rand.Rand
	classCDF []float64
	zipf     []*zipfSampler // per class, nil without shared prefix
	prefixes map[[2]int]string
	chats    [][]*chatState // per class, open chat slots
	nextSeq  int
	nextChat int
}

// NewGenerator returns a generator for a validated mix.
func NewGenerator(m *Mix, seed uint64) *Generator {
	g := &Generator{
		mix:      m,
		seed:     seed,
		rng:      rand.New(rand.NewPCG(seed, 0x5eed)),
		prefixes: map[[2]int]string{},
		zipf:     make([]*zipfSampler, len(m.Classes)),
		chats:    make([][]*chatState, len(m.Classes)),
	}
	var total float64
	for i, c := range m.Classes {
		total += *c.Weight
		g.classCDF = append(g.classCDF, total)
		if c.SharedPrefix != nil {
			g.zipf[i] = newZipf(c.SharedPrefix.Groups, c.SharedPrefix.ZipfS)
		}
		if c.MultiTurn != nil {
			g.chats[i] = make([]*chatState, c.MultiTurn.Concurrent)
		}
	}
	for i := range g.classCDF {
		g.classCDF[i] /= total
	}
	return g
}

// Next returns the next request of the sequence.
func (g *Generator) Next() RequestSpec {
	// The first class whose cumulative share exceeds u owns u; a zero-weight
	// class never does, because its predecessor's equal value wins first.
	u := g.rng.Float64()
	ci := min(sort.Search(len(g.classCDF), func(i int) bool { return g.classCDF[i] > u }), len(g.classCDF)-1)
	c := &g.mix.Classes[ci]
	spec := RequestSpec{
		Seq:         g.nextSeq,
		Class:       c.Name,
		API:         c.API,
		Model:       c.Model,
		Stream:      *c.Stream,
		PrefixGroup: -1,
		ChatID:      -1,
		MaxTokens:   g.length(c.OutputTokens),
		Headers:     map[string]string{},
	}
	g.nextSeq++
	if c.LoRA != "" {
		spec.Model = c.LoRA
	}
	for k, v := range c.Headers {
		spec.Headers[k] = v
	}
	if c.Objective != "" {
		spec.Headers[ObjectiveHeader] = c.Objective
	}
	if c.Tenant != "" {
		spec.Headers[TenantHeader] = c.Tenant
	}

	var messages []chatMessage
	if c.MultiTurn != nil {
		slot := g.rng.IntN(len(g.chats[ci]))
		chat := g.chats[ci][slot]
		if chat == nil {
			chat = &chatState{id: g.nextChat, group: -1}
			g.nextChat++
			if c.SharedPrefix != nil {
				chat.group = g.zipf[ci].sample(g.rng)
				chat.messages = append(chat.messages, chatMessage{Role: "system", Content: g.prefix(ci, chat.group)})
			}
			g.chats[ci][slot] = chat
		}
		chat.turn++
		chat.messages = append(chat.messages, chatMessage{Role: "user", Content: g.mix.PromptText.text(g.rng, g.length(c.PromptTokens))})
		messages = append(messages, chat.messages...)
		// The reply the next turn will carry as history. It is synthetic so
		// the sequence does not depend on what the server answered.
		chat.messages = append(chat.messages, chatMessage{Role: "assistant", Content: g.mix.PromptText.text(g.rng, spec.MaxTokens)})
		spec.ChatID, spec.Turn, spec.PrefixGroup = chat.id, chat.turn, chat.group
		if chat.turn >= c.MultiTurn.Turns {
			g.chats[ci][slot] = nil
		}
	} else {
		if c.SharedPrefix != nil {
			spec.PrefixGroup = g.zipf[ci].sample(g.rng)
			messages = append(messages, chatMessage{Role: "system", Content: g.prefix(ci, spec.PrefixGroup)})
		}
		messages = append(messages, chatMessage{Role: "user", Content: g.mix.PromptText.text(g.rng, g.length(c.PromptTokens))})
	}

	chars := 0
	for _, m := range messages {
		chars += len(m.Content)
	}
	spec.PromptTokens = (chars + CharsPerToken - 1) / CharsPerToken
	spec.Body = g.body(c, spec, messages)
	return spec
}

// length draws a token count uniformly from l.
func (g *Generator) length(l Length) int {
	if l.Max <= l.Min {
		return l.Min
	}
	return l.Min + g.rng.IntN(l.Max-l.Min+1)
}

// prefix returns the shared system prompt of a class's group. It depends
// only on the seed, the class name and the group, never on request order,
// so every request of a group carries byte-identical text.
func (g *Generator) prefix(ci, group int) string {
	key := [2]int{ci, group}
	if p, ok := g.prefixes[key]; ok {
		return p
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(g.mix.Classes[ci].Name))
	rng := rand.New(rand.NewPCG(g.seed^h.Sum64(), uint64(group)))
	p := g.mix.PromptText.text(rng, g.mix.Classes[ci].SharedPrefix.Tokens)
	g.prefixes[key] = p
	return p
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type requestBody struct {
	Model         string         `json:"model"`
	Messages      []chatMessage  `json:"messages,omitempty"`
	Prompt        string         `json:"prompt,omitempty"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
	IgnoreEOS     bool           `json:"ignore_eos,omitempty"`
}

func (g *Generator) body(c *Class, spec RequestSpec, messages []chatMessage) []byte {
	rb := requestBody{Model: spec.Model, MaxTokens: spec.MaxTokens, Stream: spec.Stream, IgnoreEOS: g.mix.IgnoreEOS}
	if spec.Stream {
		// Ask for the usage chunk so output tokens are counted exactly.
		rb.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	if c.API == APICompletions {
		var b strings.Builder
		for _, m := range messages {
			b.WriteString(m.Content)
		}
		rb.Prompt = b.String()
	} else {
		rb.Messages = messages
	}
	if g.mix.PromptText != TextRealistic {
		out, err := json.Marshal(rb)
		if err != nil {
			// Only strings and numbers: cannot fail.
			panic(err)
		}
		return out
	}
	// Realistic text is encoded as clients' encoders write it, with <, > and & as they are.
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(rb); err != nil {
		panic(err)
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n"))
}

// zipfSampler draws k in [0, n) with probability proportional to
// 1/(k+1)^s. Unlike math/rand's Zipf it accepts any s >= 0 (s = 0 is
// uniform), which covers the mild skews real prefix traffic shows.
type zipfSampler struct {
	cdf []float64
}

func newZipf(n int, s float64) *zipfSampler {
	z := &zipfSampler{cdf: make([]float64, n)}
	var total float64
	for k := range n {
		total += math.Pow(float64(k+1), -s)
		z.cdf[k] = total
	}
	for k := range z.cdf {
		z.cdf[k] /= total
	}
	return z
}

func (z *zipfSampler) sample(rng *rand.Rand) int {
	u := rng.Float64()
	return min(sort.Search(len(z.cdf), func(i int) bool { return z.cdf[i] > u }), len(z.cdf)-1)
}

// probability returns P(k).
func (z *zipfSampler) probability(k int) float64 {
	if k == 0 {
		return z.cdf[0]
	}
	return z.cdf[k] - z.cdf[k-1]
}
