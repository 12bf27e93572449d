package loadgen

import (
	"strings"
	"testing"
	"time"
)

func TestParseMixYAMLAndJSON(t *testing.T) {
	y := `
api: completions
stream: false
ignore_eos: true
classes:
  - name: crit
    weight: 2.5
    model: llama
    lora: sql
    objective: critical
    tenant: team-a
    headers: {x-extra: "1"}
    api: chat
    stream: true
    prompt_tokens: {min: 10, max: 20}
    output_tokens: 16
    shared_prefix: {groups: 3, tokens: 64, zipf_s: 1.1}
    multi_turn: {turns: 4}
    slo: {ttft: 250ms, itl: 20ms, e2e: 5s}
  - name: bulk
    model: llama
    prompt_tokens: 100
    output_tokens: 200
`
	m, err := ParseMix([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	c := m.Classes[0]
	if *c.Weight != 2.5 || c.API != APIChat || !*c.Stream || c.PromptTokens != (Length{10, 20}) ||
		c.OutputTokens != (Length{16, 16}) || c.SharedPrefix.ZipfS != 1.1 || c.MultiTurn.Concurrent != 8 ||
		time.Duration(c.SLO.TTFT) != 250*time.Millisecond || time.Duration(c.SLO.E2E) != 5*time.Second {
		t.Errorf("class 0 parsed as %+v", c)
	}
	b := m.Classes[1]
	if *b.Weight != 1 || b.API != APICompletions || *b.Stream || !m.IgnoreEOS {
		t.Errorf("defaults not inherited: %+v", b)
	}

	j := `{"classes":[{"name":"x","model":"m","prompt_tokens":3,"output_tokens":{"min":1,"max":2}}]}`
	mj, err := ParseMix([]byte(j))
	if err != nil {
		t.Fatal(err)
	}
	if mj.API != APIChat || !*mj.Classes[0].Stream || mj.Classes[0].OutputTokens != (Length{1, 2}) {
		t.Errorf("JSON mix parsed as %+v", mj.Classes[0])
	}
}

func TestParseMixErrors(t *testing.T) {
	for _, tc := range []struct {
		name, mix, want string
	}{
		{"empty", ``, "at least one class"},
		{"unknown field", `classes: [{name: a, model: m, prompt_tokens: 1, output_tokens: 1, colour: red}]`, "colour"},
		{"unknown top field", `clases: []`, "clases"},
		{"not yaml", `classes: [`, "parsing mix"},
		{"missing name", `classes: [{model: m, prompt_tokens: 1, output_tokens: 1}]`, "name: required"},
		{"duplicate", `classes: [{name: a, model: m, prompt_tokens: 1, output_tokens: 1}, {name: a, model: m, prompt_tokens: 1, output_tokens: 1}]`, "duplicate"},
		{"missing model", `classes: [{name: a, prompt_tokens: 1, output_tokens: 1}]`, "model: required"},
		{"negative weight", `classes: [{name: a, weight: -1, model: m, prompt_tokens: 1, output_tokens: 1}]`, "weight"},
		{"all zero weights", `classes: [{name: a, weight: 0, model: m, prompt_tokens: 1, output_tokens: 1}]`, "at least one weight"},
		{"zero prompt", `classes: [{name: a, model: m, prompt_tokens: 0, output_tokens: 1}]`, "prompt_tokens"},
		{"missing output", `classes: [{name: a, model: m, prompt_tokens: 1}]`, "output_tokens"},
		{"inverted range", `classes: [{name: a, model: m, prompt_tokens: {min: 5, max: 2}, output_tokens: 1}]`, "below min"},
		{"huge", `classes: [{name: a, model: m, prompt_tokens: 99999999, output_tokens: 1}]`, "exceeds the limit"},
		{"length type", `classes: [{name: a, model: m, prompt_tokens: "ten", output_tokens: 1}]`, "whole number"},
		{"length field", `classes: [{name: a, model: m, prompt_tokens: {lo: 1}, output_tokens: 1}]`, "whole number"},
		{"bad api", `classes: [{name: a, model: m, api: grpc, prompt_tokens: 1, output_tokens: 1}]`, "not chat or completions"},
		{"bad header", `classes: [{name: a, model: m, headers: {"bad header": x}, prompt_tokens: 1, output_tokens: 1}]`, "invalid header"},
		{"reserved header", `classes: [{name: a, model: m, headers: {Content-Type: x}, prompt_tokens: 1, output_tokens: 1}]`, "set by the load generator"},
		{"prefix groups", `classes: [{name: a, model: m, prompt_tokens: 1, output_tokens: 1, shared_prefix: {groups: 0, tokens: 5}}]`, "groups"},
		{"zipf", `classes: [{name: a, model: m, prompt_tokens: 1, output_tokens: 1, shared_prefix: {groups: 2, tokens: 5, zipf_s: -1}}]`, "zipf_s"},
		{"turns", `classes: [{name: a, model: m, prompt_tokens: 1, output_tokens: 1, multi_turn: {turns: 0}}]`, "turns"},
		{"slo", `classes: [{name: a, model: m, prompt_tokens: 1, output_tokens: 1, slo: {ttft: fast}}]`, "invalid duration"},
		{"slo number", `classes: [{name: a, model: m, prompt_tokens: 1, output_tokens: 1, slo: {ttft: 5}}]`, "duration string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseMix([]byte(tc.mix))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseMixReportsAllErrors(t *testing.T) {
	_, err := ParseMix([]byte(`classes: [{name: a, prompt_tokens: 0, output_tokens: 0}]`))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"model", "prompt_tokens", "output_tokens"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// FuzzParseMix: any input either fails with an error or yields a mix that
// validates and generates requests without panicking.
func FuzzParseMix(f *testing.F) {
	f.Add([]byte(weightedMix))
	f.Add([]byte(`classes: [{name: a, model: m, prompt_tokens: 1, output_tokens: 1, shared_prefix: {groups: 2, tokens: 3, zipf_s: 0.5}, multi_turn: {turns: 2}}]`))
	f.Add([]byte(`{"classes":[{"name":"x","model":"m","prompt_tokens":{"min":1,"max":3},"output_tokens":2}]}`))
	f.Add([]byte(`classes: [{name: a, weight: 1e308, model: m, prompt_tokens: 1, output_tokens: 1}, {name: b, weight: 1e308, model: m, prompt_tokens: 1, output_tokens: 1}]`))
	f.Add([]byte(`api: [1,2]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseMix(data)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("ParseMix returned a mix that does not validate: %v", err)
		}
		g := NewGenerator(m, 1)
		for range 3 {
			s := g.Next()
			if len(s.Body) == 0 || s.Class == "" {
				t.Fatalf("empty request %+v", s)
			}
		}
	})
}
