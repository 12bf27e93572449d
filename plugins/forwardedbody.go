package plugins

import (
	"context"
	"encoding/json"
	"slices"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

// Upstream's Director forwards a request body by encoding the parser's payload map again (json.Marshal, after its
// model rewrite), and json.Marshal checks and compacts each raw value with encoding/json's scanner: at a long prompt
// that re-encoding was a third of the EPP's CPU for the request. A ForwardedBody lets the caller of the Director take
// that work over: in its context Sluice's parser leaves a body's long members out of the payload map (the Director
// then encodes only the short ones, the model among them), and Encode writes the whole body afterwards, byte for byte
// what json.Marshal of the full map would have written, with a compaction that needs no scanner (the body is valid
// JSON: the parser checked it). Routing reads no long member of the payload map: the parsed API type carries the
// prompt, and Sluice admission reads only max_tokens and its kin (EstimatedCost).

// longMember is the size from which a member's raw value stays out of the payload map under a ForwardedBody.
const longMember = 1 << 10

// ForwardedBody is one request's body as Sluice's parser split it for the caller of upstream's Director: the
// payload map the Director encodes and rewrites, and the long members left out of it.
type ForwardedBody struct {
	longFrom int // longMember; smaller in tests
	payload  scheduling.PayloadMap
	long     map[string]json.RawMessage
}

type forwardedBodyKey struct{}

// WithForwardedBody returns a context in which Sluice's parser leaves the long members of a request body out of the
// payload map, and the ForwardedBody that encodes the body the Director would have forwarded.
func WithForwardedBody(ctx context.Context) (context.Context, *ForwardedBody) {
	f := &ForwardedBody{longFrom: longMember}
	return context.WithValue(ctx, forwardedBodyKey{}, f), f
}

func forwardedBodyOf(ctx context.Context) *ForwardedBody {
	f, _ := ctx.Value(forwardedBodyKey{}).(*ForwardedBody)
	return f
}

// Encode returns json.Marshal of the payload map (as the Director left it) with the long members put back; ok is
// false when the parser left no member out (the Director's own encoding is the body).
func (f *ForwardedBody) Encode() (body []byte, ok bool, err error) {
	if f == nil || len(f.long) == 0 {
		return nil, false, nil
	}
	keys := make([]string, 0, len(f.payload)+len(f.long))
	size := 2
	for k := range f.payload {
		keys = append(keys, k)
	}
	for k, v := range f.long {
		if _, dup := f.payload[k]; !dup {
			keys = append(keys, k)
		}
		size += len(v) + len(k) + 4
	}
	slices.Sort(keys) // encoding/json orders a map's keys so
	body = make([]byte, 0, size+64*len(f.payload))
	body = append(body, '{')
	for i, k := range keys {
		if i > 0 {
			body = append(body, ',')
		}
		key, err := json.Marshal(k)
		if err != nil {
			return nil, false, err
		}
		body = append(append(body, key...), ':')
		if v, short := f.payload[k]; short {
			value, err := json.Marshal(v)
			if err != nil {
				return nil, false, err
			}
			body = append(body, value...)
			continue
		}
		body = appendCompactJSON(body, f.long[k])
	}
	return append(body, '}'), true, nil
}

// split records the payload map and the long members ParseRequest left out of it.
func (f *ForwardedBody) split(payload scheduling.PayloadMap, long map[string]json.RawMessage) {
	f.payload, f.long = payload, long
}

// appendCompactJSON appends the valid JSON value v as json.Marshal writes a json.RawMessage: without whitespace
// outside strings, and with <, >, & and the line and paragraph separators U+2028 and U+2029 escaped (\u003c ...)
// inside them.
func appendCompactJSON(dst, v []byte) []byte {
	const hex = "0123456789abcdef"
	start := 0
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case ' ', '\t', '\n', '\r':
			dst = append(dst, v[start:i]...)
			start = i + 1
		case '"':
			for i++; i < len(v); i++ {
				c := v[i]
				if !inStringSpecial[c] {
					continue
				}
				if c == '"' {
					break
				}
				switch {
				case c == '\\':
					i++ // the escaped byte; a \u escape's hex digits need nothing
				case c == '<' || c == '>' || c == '&':
					dst = append(append(dst, v[start:i]...), '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
					start = i + 1
				case i+2 < len(v) && v[i+1] == 0x80 && v[i+2]&^1 == 0xA8: // c is 0xE2: U+2028 or U+2029
					dst = append(append(dst, v[start:i]...), '\\', 'u', '2', '0', '2', hex[v[i+2]&0xF])
					start = i + 3
					i += 2
				}
			}
		}
	}
	return append(dst, v[start:]...)
}

// inStringSpecial marks the bytes appendCompactJSON acts on inside a string.
var inStringSpecial = [256]bool{'"': true, '\\': true, '<': true, '>': true, '&': true, 0xE2: true}
