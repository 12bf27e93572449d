package plugins

import (
	"context"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

// ParseRequest returns what upstream's parser returns for a request body,
// decoding only what routing reads. Upstream decodes every body twice, once
// into its API type and once into a generic map of every value, and its
// Director then encodes that whole map again to forward the body: three full
// passes over the prompt, each allocating a copy. Here the API type is
// decoded as upstream decodes it (the same call on the same type), and the
// payload map holds each top-level value as the raw bytes of the body; only
// "model" and "stream", the values the Director and the handler read, are
// decoded. The Director's model rewrite and re-encoding then work on that
// map as on upstream's (sorted keys, compacted values).
//
// The forwarded body means the same JSON as upstream's with one deliberate
// difference: numbers keep their text, where upstream rounds every number
// through float64 (and answers 400 to a body with a number beyond its range
// that no routing decision reads). A body whose API type does not decode
// takes upstream's path, so bad requests get upstream's error word for word.
func (p *OpenAIParser) ParseRequest(ctx context.Context, body []byte, headers map[string]string) (*scheduling.LLMRequestBody, error) {
	parsed, ok := decodeRequestBody(body, headers)
	if !ok {
		return p.OpenAIParser.ParseRequest(ctx, body, headers)
	}
	payload, ok := topLevelPayload(body)
	if !ok {
		return p.OpenAIParser.ParseRequest(ctx, body, headers)
	}
	parsed.Payload = payload
	stream, _ := payload["stream"].(bool)
	parsed.Stream = stream
	return parsed, nil
}

// decodeRequestBody decodes body as the API its path names, with upstream's
// rules for which path names which API (openai.ParseRequest) and for what
// makes a valid request of each; ok is false for a body upstream rejects.
func decodeRequestBody(body []byte, headers map[string]string) (parsed *scheduling.LLMRequestBody, ok bool) {
	switch path := requestPath(headers); {
	case strings.HasSuffix(path, "/conversations"):
		var r scheduling.ConversationsRequest
		if json.Unmarshal(body, &r) == nil && len(r.Items) > 0 {
			return &scheduling.LLMRequestBody{Conversations: &r}, true
		}
	case strings.HasSuffix(path, "/responses"):
		var r scheduling.ResponsesRequest
		if json.Unmarshal(body, &r) == nil && r.Input != nil {
			return &scheduling.LLMRequestBody{Responses: &r}, true
		}
	case strings.HasSuffix(path, "/chat/completions"):
		var r scheduling.ChatCompletionsRequest
		if json.Unmarshal(body, &r) == nil && len(r.Messages) > 0 {
			return &scheduling.LLMRequestBody{ChatCompletions: &r}, true
		}
	case strings.HasSuffix(path, "/embeddings"):
		var r scheduling.EmbeddingsRequest
		if json.Unmarshal(body, &r) == nil && r.Input != nil {
			return &scheduling.LLMRequestBody{Embeddings: &r}, true
		}
	default: // "/completions", and any other path, as upstream defaults
		var r scheduling.CompletionsRequest
		if json.Unmarshal(body, &r) == nil && !r.Prompt.IsEmpty() {
			return &scheduling.LLMRequestBody{Completions: &r}, true
		}
	}
	return nil, false
}

// requestPath is the request's path as upstream's parser finds it: the
// first non-empty of :path, x-original-path and x-forwarded-path, else
// /v1/completions.
func requestPath(headers map[string]string) string {
	for _, h := range []string{":path", "x-original-path", "x-forwarded-path"} {
		if path := headers[h]; path != "" {
			return path
		}
	}
	return "/v1/completions"
}

// topLevelPayload splits a JSON object into its members: each value as the
// raw bytes of body (json.RawMessage, which encodes as itself), except
// "model" and "stream", decoded as encoding/json decodes them into a map. A
// repeated key keeps its last value, as in encoding/json. body must be a
// valid JSON document (decodeRequestBody accepted it); ok is false if it is
// not an object.
func topLevelPayload(body []byte) (payload scheduling.PayloadMap, ok bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, false
	}
	payload = scheduling.PayloadMap{}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return payload, true
	}
	for i < len(body) && body[i] == '"' {
		keyEnd := skipString(body, i)
		key, ok := unquoteKey(body[i:keyEnd])
		if !ok {
			return nil, false
		}
		i = skipSpace(body, keyEnd)
		if i >= len(body) || body[i] != ':' {
			return nil, false
		}
		start := skipSpace(body, i+1)
		end := skipValue(body, start)
		value := json.RawMessage(body[start:end:end])
		if key == "model" || key == "stream" {
			var v any
			if json.Unmarshal(value, &v) != nil {
				return nil, false
			}
			payload[key] = v
		} else {
			payload[key] = value
		}
		i = skipSpace(body, end)
		if i >= len(body) {
			return nil, false
		}
		switch body[i] {
		case '}':
			return payload, true
		case ',':
			i = skipSpace(body, i+1)
		default:
			return nil, false
		}
	}
	return nil, false
}

// unquoteKey decodes a JSON string token as encoding/json decodes an object
// key; the common key, plain ASCII without escapes, without decoding.
func unquoteKey(token []byte) (string, bool) {
	if len(token) < 2 {
		return "", false
	}
	plain := true
	for _, c := range token[1 : len(token)-1] {
		if c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain {
		return string(token[1 : len(token)-1]), true
	}
	var key string
	err := json.Unmarshal(token, &key)
	return key, err == nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the JSON string starting at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the index just past the JSON value starting at b[i].
func skipValue(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			i = skipString(b, i)
			if depth == 0 {
				return i
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
		i++
	}
	return i
}
