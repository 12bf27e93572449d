package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwkrh "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requesthandling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requesthandling/parsers/openai"
)

// OpenAIParserType is the type name of OpenAIParser.
const OpenAIParserType = "sluice-openai-parser"

// OpenAIParser is upstream's OpenAI parser that also reads the prompt-cache
// usage vLLM and OpenAI report, usage.prompt_tokens_details.cached_tokens.
// Upstream v1.5.0 looks for usage.prompt_token_details instead, so with its
// parser no response ever carries cached tokens, and the prefix-cache
// scorer's per-response calibration never runs. Name it as the config's
// parser (parser: {pluginRef: sluice-openai-parser}) to enable that.
type OpenAIParser struct {
	*openai.OpenAIParser
	name string
}

var _ fwkrh.Parser = (*OpenAIParser)(nil)

// OpenAIParserFactory builds an OpenAIParser; it takes no parameters.
func OpenAIParserFactory(name string, _ json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	return &OpenAIParser{OpenAIParser: openai.NewOpenAIParser(), name: name}, nil
}

// TypedName implements fwkplugin.Plugin.
func (p *OpenAIParser) TypedName() fwkplugin.TypedName {
	return fwkplugin.TypedName{Type: OpenAIParserType, Name: p.name}
}

// ParseResponse parses as upstream does, then fills the cached prompt tokens
// upstream missed. A streamed chunk that cannot name a usage (almost every
// chunk: one per token) gets upstream's answer for it, no usage, without
// decoding it: upstream decodes every event of every chunk.
func (p *OpenAIParser) ParseResponse(ctx context.Context, body []byte, headers map[string]string, endOfStream bool) (*fwkrh.ParsedResponse, error) {
	if len(body) > 0 && !mayNameUsage(body) && isEventStream(headers) {
		return noUsage, nil
	}
	return p.parseResponse(ctx, body, headers, endOfStream)
}

// EventStream reports whether ParseResponse takes response headers to say
// server-sent events, as upstream's parser decides it.
func (p *OpenAIParser) EventStream(headers map[string]string) bool { return isEventStream(headers) }

// NamesNoUsage reports whether ParseResponse answers a chunk of an event
// stream (EventStream) with no usage, and nothing else, without decoding it.
// Sluice's hot path answers such chunks without upstream's handler.
func (p *OpenAIParser) NamesNoUsage(body []byte) bool { return len(body) > 0 && !mayNameUsage(body) }

// noUsage is the answer for every chunk that names no usage, shared rather
// than allocated per chunk: upstream's handler, the parser's one caller, only
// reads it.
var noUsage = &fwkrh.ParsedResponse{}

// parseResponse is ParseResponse without the shortcut.
func (p *OpenAIParser) parseResponse(ctx context.Context, body []byte, headers map[string]string, endOfStream bool) (*fwkrh.ParsedResponse, error) {
	parsed, err := p.OpenAIParser.ParseResponse(ctx, body, headers, endOfStream)
	if err != nil || parsed == nil || parsed.Usage == nil || parsed.Usage.PromptTokenDetails != nil {
		return parsed, err
	}
	if cached, ok := cachedPromptTokens(body); ok {
		parsed.Usage.PromptTokenDetails = &fwkrc.PromptTokenDetails{CachedTokens: cached}
	}
	return parsed, nil
}

// cachedPromptTokens finds usage.prompt_tokens_details.cached_tokens in a JSON
// body, or in the data lines of a server-sent-events chunk.
func cachedPromptTokens(body []byte) (int, bool) {
	if n, ok := cachedTokensOf(body); ok {
		return n, true
	}
	for line := range bytes.SplitSeq(body, []byte("\n")) {
		if data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			if n, ok := cachedTokensOf(bytes.TrimSpace(data)); ok {
				return n, true
			}
		}
	}
	return 0, false
}

func cachedTokensOf(doc []byte) (int, bool) {
	var d struct {
		Usage *struct {
			Details *struct {
				CachedTokens *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(doc, &d) != nil || d.Usage == nil || d.Usage.Details == nil || d.Usage.Details.CachedTokens == nil {
		return 0, false
	}
	return *d.Usage.Details.CachedTokens, true
}

// isEventStream reports whether the response headers say server-sent events,
// as upstream's parser decides it (any header named content-type in any case,
// whose value contains text/event-stream in any case).
func isEventStream(headers map[string]string) bool {
	for k, v := range headers {
		if strings.EqualFold(k, "content-type") && strings.Contains(strings.ToLower(v), "text/event-stream") {
			return true
		}
	}
	return false
}

// mayNameUsage reports whether a JSON document, or a chunk of events, could
// hold an object key that encoding/json matches to "usage" (the only field
// that carries usage in upstream's streamed-response decoding). It matches
// keys case-insensitively under Unicode folding, where only 's' has a
// non-ASCII partner (U+017F), and after unescaping, where only \u escapes
// spell letters; so a body that contains neither "usage" in any case (with
// either s) nor a \u escape cannot.
func mayNameUsage(b []byte) bool {
	if bytes.Contains(b, []byte(`\u`)) {
		return true
	}
	// Every chunk crosses this: the u's are found with IndexByte rather than a loop over every byte.
	for _, u := range [2]byte{'u', 'U'} {
		for rest := b; ; {
			i := bytes.IndexByte(rest, u)
			if i < 0 {
				break
			}
			if foldsToSage(rest[i+1:]) {
				return true
			}
			rest = rest[i+1:]
		}
	}
	return false
}

// foldsToSage reports whether b starts with "sage" in any case, its s also
// written U+017F (UTF-8 C5 BF).
func foldsToSage(b []byte) bool {
	switch {
	case len(b) > 0 && b[0]|0x20 == 's':
		b = b[1:]
	case len(b) > 1 && b[0] == 0xC5 && b[1] == 0xBF:
		b = b[2:]
	default:
		return false
	}
	return len(b) >= 3 && b[0]|0x20 == 'a' && b[1]|0x20 == 'g' && b[2]|0x20 == 'e'
}
