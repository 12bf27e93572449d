package loadgen

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
	"sigs.k8s.io/yaml"
)

// API selects the OpenAI endpoint a class calls.
type API string

const (
	// APIChat calls /v1/chat/completions with messages.
	APIChat API = "chat"
	// APICompletions calls /v1/completions with a prompt string.
	APICompletions API = "completions"
)

// Path returns the request path of the API.
func (a API) Path() string {
	if a == APICompletions {
		return "/v1/completions"
	}
	return "/v1/chat/completions"
}

// Header names the Gateway API Inference Extension reads (GIE v1.5.0
// pkg/epp/metadata); the values are duplicated here because loadgen is a
// client and imports no gateway code.
const (
	ObjectiveHeader = "x-gateway-inference-objective"
	TenantHeader    = "x-gateway-inference-fairness-id"
)

// Limits that keep a mistyped mix file from generating absurd traffic.
const (
	maxTokensPerField = 1 << 20
	maxPrefixGroups   = 1 << 16
	maxTurns          = 1000
	maxOpenChats      = 1 << 12
)

// Mix is a weighted set of request classes, read from a mix file.
type Mix struct {
	// API is the default API of classes that set none. Default "chat".
	API API `json:"api,omitempty"`
	// Stream is the default streaming mode of classes. Default true.
	Stream *bool `json:"stream,omitempty"`
	// IgnoreEOS asks the server (vLLM's ignore_eos) to produce exactly
	// max_tokens tokens, so output lengths are what the mix says.
	IgnoreEOS bool `json:"ignore_eos,omitempty"`
	// PromptText is how generated text is written: "words" (empty means words) or "realistic" (PromptText). The
	// text draws the same random numbers either way, so a mix's requests differ only in their text.
	PromptText PromptText `json:"prompt_text,omitempty"`
	// Classes are the request classes; each request picks one by weight.
	Classes []Class `json:"classes"`
}

// Class is one kind of request.
type Class struct {
	// Name identifies the class in results. Required and unique.
	Name string `json:"name"`
	// Weight is the relative share of requests. Default 1.
	Weight *float64 `json:"weight,omitempty"`
	// Model is the base model name. Required.
	Model string `json:"model"`
	// LoRA, when set, is sent as the request's model (how vLLM addresses
	// adapters); Model is then only reported.
	LoRA string `json:"lora,omitempty"`
	// Objective is sent as x-gateway-inference-objective (priority).
	Objective string `json:"objective,omitempty"`
	// Tenant is sent as x-gateway-inference-fairness-id.
	Tenant string `json:"tenant,omitempty"`
	// Headers are extra request headers.
	Headers map[string]string `json:"headers,omitempty"`
	// API overrides Mix.API.
	API API `json:"api,omitempty"`
	// Stream overrides Mix.Stream.
	Stream *bool `json:"stream,omitempty"`
	// PromptTokens is the length of the request's own prompt text in tokens
	// (TokensPerChar rule), excluding a shared prefix and earlier turns.
	PromptTokens Length `json:"prompt_tokens"`
	// OutputTokens is max_tokens.
	OutputTokens Length `json:"output_tokens"`
	// SharedPrefix puts a shared system prompt in front of the prompt.
	SharedPrefix *SharedPrefix `json:"shared_prefix,omitempty"`
	// MultiTurn makes requests turns of chats that resend their history.
	MultiTurn *MultiTurn `json:"multi_turn,omitempty"`
	// SLO is used for goodput; zero fields fall back to the run's SLO.
	SLO SLO `json:"slo,omitempty"`
}

// Length is a token count: a number (fixed) or {min, max} (uniform,
// inclusive).
type Length struct {
	Min int `json:"min"`
	Max int `json:"max"`
}

// UnmarshalJSON accepts 128 or {"min": 64, "max": 256}.
func (l *Length) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] != '{' {
		var n int
		if err := json.Unmarshal(b, &n); err != nil {
			return fmt.Errorf("want a whole number of tokens or {min, max}: %w", err)
		}
		l.Min, l.Max = n, n
		return nil
	}
	type plain Length
	var p plain
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("want a whole number of tokens or {min, max}: %w", err)
	}
	*l = Length(p)
	return nil
}

func (l Length) validate(min int) error {
	switch {
	case l.Min < min:
		return fmt.Errorf("must be at least %d, got %d", min, l.Min)
	case l.Max < l.Min:
		return fmt.Errorf("max %d is below min %d", l.Max, l.Min)
	case l.Max > maxTokensPerField:
		return fmt.Errorf("%d exceeds the limit of %d tokens", l.Max, maxTokensPerField)
	}
	return nil
}

// SharedPrefix describes shared system prompts: Groups distinct prompts of
// Tokens tokens each; each request uses one group, chosen by a Zipf law
// with exponent ZipfS (0 = uniform). With s around 1 a few groups are hot,
// which is the skew that melts one pod under naive prefix affinity.
type SharedPrefix struct {
	Groups int     `json:"groups"`
	Tokens int     `json:"tokens"`
	ZipfS  float64 `json:"zipf_s,omitempty"`
}

// MultiTurn makes a class's requests turns of chats. Each chat has Turns
// turns; each turn resends the whole history (system prompt, earlier user
// turns and synthetic assistant replies of the class's output length) plus
// a new user prompt. Up to Concurrent chats per class are open at once
// (default 8), and a request continues a randomly chosen one.
type MultiTurn struct {
	Turns      int `json:"turns"`
	Concurrent int `json:"concurrent,omitempty"`
}

// SLO bounds what counts as goodput. Zero fields are not checked.
type SLO struct {
	// TTFT bounds time to the first content token, counted from the first
	// attempt (retries included).
	TTFT Duration `json:"ttft,omitempty"`
	// ITL bounds the mean inter-token latency of the request.
	ITL Duration `json:"itl,omitempty"`
	// E2E bounds end-to-end latency from the first attempt.
	E2E Duration `json:"e2e,omitempty"`
}

// orElse fills zero fields of s from d.
func (s SLO) orElse(d SLO) SLO {
	if s.TTFT == 0 {
		s.TTFT = d.TTFT
	}
	if s.ITL == 0 {
		s.ITL = d.ITL
	}
	if s.E2E == 0 {
		s.E2E = d.E2E
	}
	return s
}

// Duration is a time.Duration written as a Go duration string ("250ms").
type Duration time.Duration

// UnmarshalJSON parses "250ms", "2s", ...
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"250ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("duration %q is negative", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// ParseMix reads a mix file (YAML or JSON), rejects unknown fields, applies
// defaults and validates it, reporting every problem at once.
func ParseMix(data []byte) (*Mix, error) {
	var m Mix
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		return nil, fmt.Errorf("parsing mix: %w", err)
	}
	m.applyDefaults()
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("invalid mix: %w", err)
	}
	return &m, nil
}

func (m *Mix) applyDefaults() {
	if m.API == "" {
		m.API = APIChat
	}
	if m.Stream == nil {
		t := true
		m.Stream = &t
	}
	for i := range m.Classes {
		c := &m.Classes[i]
		if c.Weight == nil {
			w := 1.0
			c.Weight = &w
		}
		if c.API == "" {
			c.API = m.API
		}
		if c.Stream == nil {
			s := *m.Stream
			c.Stream = &s
		}
		if c.MultiTurn != nil && c.MultiTurn.Concurrent == 0 {
			c.MultiTurn.Concurrent = 8
		}
	}
}

// Validate checks a defaulted mix.
func (m *Mix) Validate() error {
	var errs []error
	if m.API != APIChat && m.API != APICompletions {
		errs = append(errs, fmt.Errorf("api: %q is not chat or completions", m.API))
	}
	if err := m.PromptText.validate(); err != nil {
		errs = append(errs, fmt.Errorf("prompt_text: %w", err))
	}
	if len(m.Classes) == 0 {
		errs = append(errs, errors.New("classes: at least one class is required"))
	}
	names := map[string]bool{}
	var total float64
	for i, c := range m.Classes {
		at := func(field string, err error) {
			errs = append(errs, fmt.Errorf("classes[%d] (%s): %s: %w", i, c.Name, field, err))
		}
		if c.Name == "" {
			at("name", errors.New("required"))
		} else if names[c.Name] {
			at("name", errors.New("duplicate"))
		}
		names[c.Name] = true
		if c.Weight == nil || math.IsNaN(*c.Weight) || math.IsInf(*c.Weight, 0) || *c.Weight < 0 {
			at("weight", errors.New("must be a finite number >= 0"))
		} else {
			total += *c.Weight
		}
		if c.Model == "" {
			at("model", errors.New("required"))
		}
		if c.API != APIChat && c.API != APICompletions {
			at("api", fmt.Errorf("%q is not chat or completions", c.API))
		}
		if err := c.PromptTokens.validate(1); err != nil {
			at("prompt_tokens", err)
		}
		if err := c.OutputTokens.validate(1); err != nil {
			at("output_tokens", err)
		}
		for k, v := range c.Headers {
			if !httpguts.ValidHeaderFieldName(k) || !httpguts.ValidHeaderFieldValue(v) {
				at("headers", fmt.Errorf("invalid header %q", k))
			}
			switch strings.ToLower(k) {
			case "content-type", "content-length", "host", "transfer-encoding":
				at("headers", fmt.Errorf("%q is set by the load generator", k))
			}
		}
		for field, v := range map[string]string{"objective": c.Objective, "tenant": c.Tenant, "model": c.Model, "lora": c.LoRA} {
			if !httpguts.ValidHeaderFieldValue(v) || strings.ContainsAny(v, "\r\n") {
				at(field, errors.New("contains characters not allowed in a header"))
			}
		}
		if p := c.SharedPrefix; p != nil {
			if p.Groups < 1 || p.Groups > maxPrefixGroups {
				at("shared_prefix.groups", fmt.Errorf("must be in 1..%d, got %d", maxPrefixGroups, p.Groups))
			}
			if p.Tokens < 1 || p.Tokens > maxTokensPerField {
				at("shared_prefix.tokens", fmt.Errorf("must be in 1..%d, got %d", maxTokensPerField, p.Tokens))
			}
			if math.IsNaN(p.ZipfS) || math.IsInf(p.ZipfS, 0) || p.ZipfS < 0 || p.ZipfS > 10 {
				at("shared_prefix.zipf_s", fmt.Errorf("must be in [0, 10], got %v", p.ZipfS))
			}
		}
		if t := c.MultiTurn; t != nil {
			if t.Turns < 1 || t.Turns > maxTurns {
				at("multi_turn.turns", fmt.Errorf("must be in 1..%d, got %d", maxTurns, t.Turns))
			}
			if t.Concurrent < 1 || t.Concurrent > maxOpenChats {
				at("multi_turn.concurrent", fmt.Errorf("must be in 1..%d, got %d", maxOpenChats, t.Concurrent))
			}
			if t.Turns > 0 && t.Turns <= maxTurns && int64(t.Turns)*int64(c.PromptTokens.Max+c.OutputTokens.Max) > maxTokensPerField {
				at("multi_turn", fmt.Errorf("a full chat would exceed %d tokens", maxTokensPerField))
			}
		}
	}
	if len(m.Classes) > 0 && total <= 0 {
		errs = append(errs, errors.New("classes: at least one weight must be positive"))
	}
	if math.IsInf(total, 0) {
		errs = append(errs, errors.New("classes: the weights add up to more than a float64 holds"))
	}
	return errors.Join(errs...)
}
