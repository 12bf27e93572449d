package plugins

import (
	"bytes"
	"context"
	"encoding/json"

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
// upstream missed.
func (p *OpenAIParser) ParseResponse(ctx context.Context, body []byte, headers map[string]string, endOfStream bool) (*fwkrh.ParsedResponse, error) {
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
