package plugins

import (
	"bytes"
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
// decoded as upstream decodes it (the same call on the same type; a chat's
// messages with one read of each content, decodeChat), and the payload map
// holds each top-level value as the raw bytes of the body; only
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
	parsed, ends, ok := decodeRequestBody(body, headers)
	if !ok {
		return p.OpenAIParser.ParseRequest(ctx, body, headers)
	}
	forwarded := forwardedBodyOf(ctx)
	longFrom := -1
	if forwarded != nil {
		longFrom = forwarded.longFrom
	}
	payload, long, ok := topLevelPayload(body, longFrom, ends)
	if !ok {
		return p.OpenAIParser.ParseRequest(ctx, body, headers)
	}
	if forwarded != nil {
		forwarded.split(payload, long, ends)
	}
	parsed.Payload = payload
	stream, _ := payload["stream"].(bool)
	parsed.Stream = stream
	return parsed, nil
}

// decodeRequestBody decodes body as the API its path names, with upstream's
// rules for which path names which API (openai.ParseRequest) and for what
// makes a valid request of each; ok is false for a body upstream rejects.
// ends are the body's long strings as a chat's validation delimited them (nil
// for other APIs).
func decodeRequestBody(body []byte, headers map[string]string) (parsed *scheduling.LLMRequestBody, ends stringEnds, ok bool) {
	switch path := requestPath(headers); {
	case strings.HasSuffix(path, "/conversations"):
		var r scheduling.ConversationsRequest
		if json.Unmarshal(body, &r) == nil && len(r.Items) > 0 {
			return &scheduling.LLMRequestBody{Conversations: &r}, nil, true
		}
	case strings.HasSuffix(path, "/responses"):
		var r scheduling.ResponsesRequest
		if json.Unmarshal(body, &r) == nil && r.Input != nil {
			return &scheduling.LLMRequestBody{Responses: &r}, nil, true
		}
	case strings.HasSuffix(path, "/chat/completions"):
		if r, ends, ok := decodeChat(body); ok {
			return &scheduling.LLMRequestBody{ChatCompletions: r}, ends, true
		}
		var r scheduling.ChatCompletionsRequest
		if json.Unmarshal(body, &r) == nil && len(r.Messages) > 0 {
			return &scheduling.LLMRequestBody{ChatCompletions: &r}, nil, true
		}
	case strings.HasSuffix(path, "/embeddings"):
		var r scheduling.EmbeddingsRequest
		if json.Unmarshal(body, &r) == nil && r.Input != nil {
			return &scheduling.LLMRequestBody{Embeddings: &r}, nil, true
		}
	default: // "/completions", and any other path, as upstream defaults
		var r scheduling.CompletionsRequest
		if json.Unmarshal(body, &r) == nil && !r.Prompt.IsEmpty() {
			return &scheduling.LLMRequestBody{Completions: &r}, nil, true
		}
	}
	return nil, nil, false
}

// A chat's messages carry almost all of a long prompt's bytes, and encoding/json reads each message's content four
// times: the document's validation and decoding, then, in upstream's Content.UnmarshalJSON, the content's own
// validation and decoding. decodeChat validates the document but its long strings (validJSONButLong; with them
// checked, it accepts what json.Valid accepts), splits the messages with the byte scanners below (eachMember,
// skipValue) and decodes a string content with unquoteString, which checks it and copies the spans between escapes as
// they stand in one read; a long string no decoding read is checked after. Every other member,
// message and content goes through encoding/json and upstream's methods. Whatever it cannot decode exactly as encoding/json would
// (a key that could fold onto a field name, a repeated key, a message that is not an object) leaves the body to
// json.Unmarshal.

// decodeChat decodes a chat completions request as json.Unmarshal does into scheduling.ChatCompletionsRequest; ok
// is false when the body is not valid JSON, does not decode, or is one decodeChat leaves to json.Unmarshal. ends are
// the body's long strings, delimited once by the validation, for the scans of the body after it.
func decodeChat(body []byte) (r *scheduling.ChatCompletionsRequest, ends stringEnds, ok bool) {
	unchecked, ends, ok := validJSONButLong(body, longMember)
	if !ok {
		return nil, nil, false
	}
	rest := make([]byte, 0, 256)
	rest = append(rest, '{')
	var messages []byte
	complete := ends.eachMember(body, func(rawKey []byte, key string, value []byte) bool {
		switch {
		case key == "messages" && messages == nil:
			messages = value
			return true
		case key == "messages" || mayFoldOnto(key, "messages"):
			return false
		}
		if len(rest) > 1 {
			rest = append(rest, ',')
		}
		rest = append(append(append(rest, rawKey...), ':'), value...)
		return true
	})
	if !complete || messages == nil {
		return nil, nil, false
	}
	r = &scheduling.ChatCompletionsRequest{}
	if json.Unmarshal(append(rest, '}'), r) != nil {
		return nil, nil, false
	}
	var checked []*byte
	if r.Messages, ok = decodeMessages(messages, ends, &checked); !ok || len(r.Messages) == 0 {
		return nil, nil, false
	}
	// The long strings the decoding did not read: any other member's, or in a content that is not a string. Both lists
	// are in the body's order and checked holds only long contents, so one walk pairs them (a string it fails to pair
	// is only checked again).
	next := 0
	for _, at := range unchecked {
		if next < len(checked) && checked[next] == &body[at] {
			next++
			continue
		}
		if _, ok := validString(body, at); !ok {
			return nil, nil, false
		}
	}
	return r, ends, true
}

// decodeMessages decodes a valid JSON array of message objects (string contents checked as they are decoded); ok is
// false for anything else. It adds to checked, in order, where each long string content (longMember bytes or more, as
// validJSONButLong leaves unchecked) it decoded starts. ends are the long strings the validation delimited.
func decodeMessages(b []byte, ends stringEnds, checked *[]*byte) (msgs []scheduling.Message, ok bool) {
	if len(b) < 2 || b[0] != '[' {
		return nil, false
	}
	i := skipSpace(b, 1)
	if b[i] == ']' {
		return []scheduling.Message{}, true
	}
	for {
		end := ends.skipValue(b, i)
		m, ok := decodeMessage(b[i:end], ends, checked)
		if !ok {
			return nil, false
		}
		msgs = append(msgs, m)
		i = skipSpace(b, end)
		if b[i] == ']' {
			return msgs, true
		}
		i = skipSpace(b, i+1) // past the comma
	}
}

// decodeMessage decodes a valid JSON object into a message (a string content checked as it is decoded); ok is false
// for anything else. It adds to checked where a long string content starts.
func decodeMessage(b []byte, ends stringEnds, checked *[]*byte) (m scheduling.Message, ok bool) {
	var role, content []byte
	complete := ends.eachMember(b, func(_ []byte, key string, value []byte) bool {
		switch {
		case key == "role" && role == nil:
			role = value
		case key == "content" && content == nil:
			content = value
		case key == "role" || key == "content" || mayFoldOnto(key, "role") || mayFoldOnto(key, "content"):
			return false
		}
		return true
	})
	if !complete {
		return m, false
	}
	if role != nil && json.Unmarshal(role, &m.Role) != nil {
		return m, false
	}
	switch {
	case content == nil:
	case content[0] == '"':
		if m.Content.Raw, ok = unquoteString(content); !ok {
			return m, false
		}
		if len(content) >= longMember {
			*checked = append(*checked, &content[0])
		}
	default:
		if m.Content.UnmarshalJSON(content) != nil {
			return m, false
		}
	}
	return m, true
}

// mayFoldOnto reports whether encoding/json could match key to a field named name other than by equality: an
// ASCII key equal to it under case folding, or any key outside ASCII (Unicode folding maps some letters onto ASCII
// ones).
func mayFoldOnto(key, name string) bool {
	for i := 0; i < len(key); i++ {
		if key[i] >= utf8.RuneSelf {
			return true
		}
	}
	return strings.EqualFold(key, name)
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
// repeated key keeps its last value, as in encoding/json. A value of
// longFrom bytes or more (unless longFrom is negative) goes to long instead of
// the payload (see ForwardedBody). body must be a valid JSON document (decodeRequestBody
// accepted it, delimiting the long strings in ends); ok is false if it is not an object.
func topLevelPayload(body []byte, longFrom int, ends stringEnds) (payload scheduling.PayloadMap, long map[string]json.RawMessage, ok bool) {
	payload = scheduling.PayloadMap{}
	ok = ends.eachMember(body, func(_ []byte, key string, value []byte) bool {
		if key != "model" && key != "stream" {
			if longFrom >= 0 && len(value) >= longFrom {
				if long == nil {
					long = map[string]json.RawMessage{}
				}
				long[key] = value
				delete(payload, key)
				return true
			}
			payload[key] = json.RawMessage(value)
			delete(long, key)
			return true
		}
		var v any
		if json.Unmarshal(value, &v) != nil {
			return false
		}
		payload[key] = v
		return true
	})
	if !ok {
		return nil, nil, false
	}
	return payload, long, true
}

// eachMember calls f with each member of a valid JSON object: its key as written, the key decoded, and its value.
// It stops when f returns false or the object ends, and reports whether it went through the whole object.
func eachMember(body []byte, f func(rawKey []byte, key string, value []byte) bool) bool {
	return stringEnds(nil).eachMember(body, f)
}

// stringEnds is the length (quotes included) of each long string of a body, by its opening quote, as the validation
// found it (validJSONButLong). A long prompt's closing quote is found by a search that stops at every escaped quote;
// the scans of the same bytes after the validation (the chat's members, its messages, each message's members, the
// payload's members, the forwarded body's compaction) look the string up instead of searching it again. Any other
// string, and every string when the map is nil, is searched for as skipString does.
type stringEnds map[*byte]int

// skipString is skipString(b, i), looked up when the string at b[i] is one of e's.
func (e stringEnds) skipString(b []byte, i int) int {
	if n, ok := e[&b[i]]; ok {
		return i + n
	}
	return skipString(b, i)
}

// eachMember is eachMember, its values' strings looked up in e.
func (e stringEnds) eachMember(body []byte, f func(rawKey []byte, key string, value []byte) bool) bool {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return true
	}
	for i < len(body) && body[i] == '"' {
		keyEnd := skipString(body, i)
		key, ok := unquoteKey(body[i:keyEnd])
		if !ok {
			return false
		}
		rawKey := body[i:keyEnd]
		i = skipSpace(body, keyEnd)
		if i >= len(body) || body[i] != ':' {
			return false
		}
		start := skipSpace(body, i+1)
		end := e.skipValue(body, start)
		if !f(rawKey, key, body[start:end:end]) {
			return false
		}
		i = skipSpace(body, end)
		if i >= len(body) {
			return false
		}
		switch body[i] {
		case '}':
			return true
		case ',':
			i = skipSpace(body, i+1)
		default:
			return false
		}
	}
	return false
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

// skipString returns the index just past the JSON string starting at b[i]: past the first quote after it that an
// even number of backslashes precedes (found with bytes.IndexByte, as a prompt is one long string).
func skipString(b []byte, i int) int {
	end, _ := stringEnd(b, i)
	return end
}

// stringEnd is skipString's index, and whether a quote closes the string there (else it is len(b)).
func stringEnd(b []byte, i int) (end int, closed bool) {
	for i++; i < len(b); i++ {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			break
		}
		i += q
		escapes := 0
		for k := i - 1; b[k] == '\\'; k-- {
			escapes++
		}
		if escapes%2 == 0 {
			return i + 1, true
		}
	}
	return len(b), false
}

// skipValue returns the index just past the JSON value starting at b[i], the ends of its long strings looked up in e.
func (e stringEnds) skipValue(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			i = e.skipString(b, i)
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
