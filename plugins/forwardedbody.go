package plugins

import (
	"bytes"
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
	ends     stringEnds // the long strings of the body long's members are of, delimited by the parser
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
// false when the parser left no member out (the Director's own encoding is the body). The body is written once, into
// one buffer of sizeBound: the short members' encodings, and the long members' bytes appended span by span, less what
// compaction drops and with what it escapes.
func (f *ForwardedBody) Encode() (body []byte, ok bool, err error) {
	if f == nil || len(f.long) == 0 {
		return nil, false, nil
	}
	keys := f.sortedKeys()
	out := make([]byte, 0, f.sizeBound(keys))
	out = append(out, '{')
	for i, k := range keys {
		if i > 0 {
			out = append(out, ',')
		}
		key, err := json.Marshal(k)
		if err != nil {
			return nil, false, err
		}
		out = append(append(out, key...), ':')
		if v, short := f.payload[k]; short {
			value, err := json.Marshal(v)
			if err != nil {
				return nil, false, err
			}
			out = append(out, value...)
			continue
		}
		out = f.ends.appendCompact(out, f.long[k], plainStringMin)
	}
	return append(out, '}'), true, nil
}

// sortedKeys are the keys of the payload map and the long members, in encoding/json's order for a map's keys.
func (f *ForwardedBody) sortedKeys() []string {
	keys := make([]string, 0, len(f.payload)+len(f.long))
	for k := range f.payload {
		keys = append(keys, k)
	}
	for k := range f.long {
		if _, dup := f.payload[k]; !dup {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// sizeBound is the size of Encode's buffer for the members keys: each raw value (every long member, and the short
// ones the parser left raw) as it stands plus what compaction can add to it, and 64 bytes for each key with its quotes,
// colon and comma and a short decoded value (the model, stream). An outgrown buffer is allocated and copied again at
// the end of a long prompt.
func (f *ForwardedBody) sizeBound(keys []string) int {
	size := 2
	for _, k := range keys {
		v, short := f.payload[k]
		raw, _ := v.(json.RawMessage)
		if !short {
			raw = f.long[k]
		}
		size += 64 + len(raw) + compactGrowth(raw)
	}
	return size
}

// compactGrowth is the most appendCompact can add to v: five bytes for each <, > and & (escaped as \u003c ...) and
// three for each 0xE2 (U+2028 and U+2029 start with it). Code and markup in a prompt bring more of them than a fixed share
// of slack covers.
func compactGrowth(v []byte) int {
	return 5*(bytes.Count(v, []byte{'<'})+bytes.Count(v, []byte{'>'})+bytes.Count(v, []byte{'&'})) +
		3*bytes.Count(v, []byte{0xE2})
}

// split records the payload map and the long members ParseRequest left out of it, and the body's long strings.
func (f *ForwardedBody) split(payload scheduling.PayloadMap, long map[string]json.RawMessage, ends stringEnds) {
	f.payload, f.long, f.ends = payload, long, ends
}

// appendCompact appends to dst the valid JSON value v as json.Marshal writes a json.RawMessage (without whitespace
// outside strings, and with <, >, & and the line and paragraph separators U+2028 and U+2029 escaped as \u003c ...
// inside them): spans of v itself (what compaction keeps as it is, nearly all of a long prompt) and the escapes that
// replace what it changes. Inside a string only those four characters change: an escape's backslash needs no
// attention, since the byte after it and a \u escape's hex digits are never one of them, and the string's end is
// found by skipString, or looked up in e. A long string (of more than plainFrom bytes) is read by
// appendCompactString; a short one a byte at a time.
func (e stringEnds) appendCompact(dst, v []byte, plainFrom int) []byte {
	start := 0
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case ' ', '\t', '\n', '\r':
			dst = append(dst, v[start:i]...)
			start = i + 1
		case '"':
			end := e.skipString(v, i) - 1 // the closing quote
			if end-i > plainFrom {
				dst, start = appendCompactString(dst, v, start, i+1, end)
				i = end
				continue
			}
			for i++; i < end; i++ {
				switch c := v[i]; {
				case c == '<' || c == '>' || c == '&':
					dst = append(append(dst, v[start:i]...), jsonEscapes[c]...)
					start = i + 1
				case c == 0xE2 && i+2 < end && v[i+1] == 0x80 && v[i+2]&^1 == 0xA8: // U+2028 or U+2029
					dst = append(append(dst, v[start:i]...), jsonEscapes[v[i+2]]...)
					start = i + 3
					i += 2
				}
			}
		}
	}
	return append(dst, v[start:]...)
}

// appendCompactString appends to dst the bytes of v from start up to each character of the string content v[from:to]
// that appendCompact escapes, and that character's escape; it returns dst and where the bytes still to append start.
// It keeps, for each of the four bytes it looks for (<, >, & and 0xE2, the first byte of U+2028 and U+2029, which
// other characters start with too), the index of its next occurrence, and looks again with bytes.IndexByte only for
// the byte it has just passed: each byte's search reads the string once, as a vector scan, and a real prompt's <, &,
// € or em dash every few dozen bytes costs one call, not a stop of a byte-at-a-time or word-at-a-time loop.
func appendCompactString(dst, v []byte, start, from, to int) ([]byte, int) {
	s := v[:to]
	var next [len(compactedBytes)]int
	for k, c := range compactedBytes {
		next[k] = indexByteFrom(s, from, c)
	}
	for {
		k := 0
		for j := 1; j < len(next); j++ {
			if next[j] < next[k] {
				k = j
			}
		}
		i := next[k]
		if i == to {
			return dst, start
		}
		switch c := compactedBytes[k]; {
		case c != 0xE2:
			dst = append(append(dst, v[start:i]...), jsonEscapes[c]...)
			start = i + 1
		case i+2 < to && v[i+1] == 0x80 && v[i+2]&^1 == 0xA8: // U+2028 or U+2029
			dst = append(append(dst, v[start:i]...), jsonEscapes[v[i+2]]...)
			start = i + 3
		}
		next[k] = indexByteFrom(s, i+1, compactedBytes[k])
	}
}

// compactedBytes are the bytes appendCompactString looks for in a string.
var compactedBytes = [...]byte{'<', '>', '&', 0xE2}

// indexByteFrom is the index of the first c in s at or after from, or len(s).
func indexByteFrom(s []byte, from int, c byte) int {
	if i := bytes.IndexByte(s[from:], c); i >= 0 {
		return from + i
	}
	return len(s)
}

// jsonEscapes are the escapes appendCompact writes, by the byte they replace (the last byte of U+2028 and U+2029).
var jsonEscapes = [256][]byte{
	'<': []byte(`\u003c`), '>': []byte(`\u003e`), '&': []byte(`\u0026`), 0xA8: []byte(`\u2028`), 0xA9: []byte(`\u2029`),
}

// plainStringMin is the string length from which appendCompact looks for the bytes it escapes with
// bytes.IndexByte (appendCompactString) rather than a byte at a time.
const plainStringMin = 64
