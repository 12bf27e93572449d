package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// forwardedBodies are long bodies for the ForwardedBody cases beside requestBodies: what compaction and escaping
// act on (whitespace between tokens, <, >, &, U+2028 and U+2029 raw and escaped, escaped quotes and backslashes next
// to them), a long member repeated, and long members of every API.
var forwardedBodies = []string{
	`{ "stream" : true,"messages" : [ {"role" : "user", "content" : "` + strings.Repeat("a <b> & \u2028 \u2029 \\\" \\\\ \\u003c é ", 60) + `"} ] , "model":"m", "max_tokens" : 5 }`,
	`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}],"messages":[{"role":"user","content":"short"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"short"}],"tools":[` + strings.Repeat(`{"type":"function","function":{"name":"f","parameters":{"a":[1, 2.50, -3e2, true, null]}}},`, 30) + `{}]}`,
	`{"model":"m","prompt":"` + strings.Repeat("p\t<&>", 400) + `","zz":1,"AA":{"b":"c"}}`,
	`{"model":"m","input":["` + strings.Repeat("e", 1500) + `", "` + strings.Repeat("f", 100) + `"]}`,
}

// TestForwardedBodyEncodesAsTheDirector: under WithForwardedBody, the payload map the Director encodes holds only
// the short members, and Encode writes, byte for byte, what json.Marshal of the whole map (upstream's Director's
// encoding) writes after the Director's model rewrite. Long members are left out from longMember bytes, and from
// every size (threshold 0).
func TestForwardedBodyEncodesAsTheDirector(t *testing.T) {
	parser := newTestOpenAIParser(t)
	for _, longFrom := range []int{longMember, 0} {
		for _, path := range requestPaths {
			for _, body := range append(forwardedBodies, requestBodies...) {
				if err := sameForwardedBody(parser, path, []byte(body), longFrom); err != nil {
					t.Errorf("long from %d bytes, path %q, body %.80q: %v", longFrom, path, body, err)
				}
			}
		}
	}
}

// sameForwardedBody parses body with and without a ForwardedBody leaving members of longFrom bytes or more out, does
// what upstream's Director does with each payload (the model rewritten, the map encoded), and reports a difference
// in the forwarded bytes, or a long member left in the map the Director sees.
func sameForwardedBody(p *OpenAIParser, path string, body []byte, longFrom int) error {
	headers := map[string]string{}
	if path != "" {
		headers[":path"] = path
	}
	want, wantErr := p.ParseRequest(context.Background(), body, headers)
	ctx, forwarded := WithForwardedBody(context.Background())
	forwarded.longFrom = longFrom
	got, gotErr := p.ParseRequest(ctx, body, headers)
	if gotErr != nil || wantErr != nil {
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			return fmt.Errorf("error %v, without a ForwardedBody %v", gotErr, wantErr)
		}
		return nil
	}
	director := func(payload scheduling.RequestPayload) ([]byte, error) {
		m := payload.(scheduling.PayloadMap)
		if _, ok := m["model"].(string); ok {
			m["model"] = "rewritten <&>"
		}
		for k, v := range m {
			if raw, ok := v.(json.RawMessage); ok && longFrom > 0 && len(raw) >= longFrom {
				return nil, fmt.Errorf("member %q of %d bytes left in the payload map", k, len(raw))
			}
		}
		return json.Marshal(m)
	}
	wantBody, err := json.Marshal(func() scheduling.PayloadMap {
		m := want.Payload.(scheduling.PayloadMap)
		if _, ok := m["model"].(string); ok {
			m["model"] = "rewritten <&>"
		}
		return m
	}())
	if err != nil {
		return err
	}
	directorBody, err := director(got.Payload)
	if err != nil {
		return err
	}
	gotBody, ok, err := forwarded.Encode()
	if err != nil {
		return err
	}
	if !ok {
		gotBody = directorBody // nothing left out: the Director's encoding is the body
	}
	if !bytes.Equal(gotBody, wantBody) {
		return fmt.Errorf("forwarded\n%s\nupstream's Director forwards\n%s", gotBody, wantBody)
	}
	return nil
}

// TestForwardedBodyFitsItsBuffer: Encode writes the body into the buffer sizeBound sized, never outgrowing it (a
// copy of a long prompt), on bodies whose compaction escapes many <, > and & (realistic text, markup) and drops
// whitespace, with the Director's model rewrite.
func TestForwardedBodyFitsItsBuffer(t *testing.T) {
	parser := newTestOpenAIParser(t)
	bodies := append([]string{
		`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("<&>", 2000) + `"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"` + stringContent(loadgen.TextRealistic.Text(6, 64<<10)) + `"}]}`,
		`{"model":"m","tools":[` + strings.Repeat(`{"d":"<a href=\"x\">&amp;</a>"},`, 25) + `{}],"prompt":"` +
			strings.Repeat(" <", 700) + `"}`,
	}, forwardedBodies...)
	for _, path := range requestPaths {
		for i, body := range bodies {
			ctx, forwarded := WithForwardedBody(context.Background())
			parsed, err := parser.ParseRequest(ctx, []byte(body), map[string]string{":path": path})
			if err != nil {
				continue
			}
			if m := parsed.Payload.(scheduling.PayloadMap); m["model"] != nil {
				m["model"] = "rewritten <&>"
			}
			got, ok, err := forwarded.Encode()
			if err != nil || !ok {
				continue
			}
			if bound := forwarded.sizeBound(forwarded.sortedKeys()); cap(got) != bound {
				t.Errorf("path %q, body %d: body of %d bytes in a buffer of %d, sized %d", path, i, len(got), cap(got), bound)
			}
		}
	}
}

// TestAppendCompactAsMarshal holds appendCompact to encoding/json's encoding of a json.RawMessage on strings built
// around each byte appendCompactString looks for: at a string's first and last byte, next to an escape's backslash
// (which it does not stop at), U+2028 and U+2029 raw and escaped, 0xE2 starting other characters and cut short before
// the string ends, bytes that are not UTF-8, and load generator's realistic text; each at both sides of
// plainStringMin and read by both paths.
func TestAppendCompactAsMarshal(t *testing.T) {
	long := strings.Repeat("w", plainStringMin)
	contents := []string{
		"<" + long, long + ">", "&" + long + "&", long + "<>&",
		long + `\\<`, long + `\"&\"`, `\\\\>` + long, long + `\u003c\u0026\u2028`, long + `\u00e2\u0080\u00a8`,
		long + "\u2028", "\u2029" + long, long + "\u2028\u2029\u2028", long + "\u2027\u202a", long + "\u20ac\u2014—€",
		long + "\xe2", long + "\xe2\x80", "\xe2\x80\xa8\xe2" + long, long + "\xe2\xe2\x80\xa9", long + "\xff<\xc3&",
		long + `\ud83d\ude42<🙂&`, long + `\t\n\r\b\f\/`,
		stringContent(loadgen.TextRealistic.Text(1, 512)), stringContent(loadgen.TextRealistic.Text(2, 16)),
	}
	checked := 0
	for i, content := range contents {
		for _, cut := range []int{0, 1, plainStringMin - 1, plainStringMin, plainStringMin + 1} {
			if cut > len(content) {
				continue
			}
			// The content from its cut on, so that every byte looked for lands at the start, the end and at each side
			// of plainStringMin (a cut may split a character or an escape: the value is then skipped if not JSON).
			for _, v := range []string{`"` + content[cut:] + `"`, `["` + content[:len(content)-cut] + `", "x<"]`, `{"k" : "` + content + `"}`} {
				want, err := json.Marshal(json.RawMessage(v))
				if err != nil {
					continue
				}
				checked++
				for _, plainFrom := range []int{0, plainStringMin} {
					if got := stringEnds(nil).appendCompact([]byte("x"), []byte(v), plainFrom)[1:]; !bytes.Equal(got, want) {
						t.Errorf("content %d, cut %d, plainFrom %d: %.200q, encoding/json %.200q", i, cut, plainFrom, got, want)
					}
				}
			}
		}
	}
	// Most values are JSON; a change that made the contents' cuts invalid would leave the test checking nothing.
	if least := 3 * len(contents); checked < least {
		t.Errorf("%d values checked, want at least %d", checked, least)
	}
}

// stringContent is s written as the content of a JSON string as clients write it (without HTML escapes).
func stringContent(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		panic(err)
	}
	return strings.TrimSuffix(strings.TrimSuffix(b.String(), "\n"), `"`)[1:]
}

// FuzzCompactPieces holds appendCompact to encoding/json's encoding of a json.RawMessage (compacted, with
// <, >, &, U+2028 and U+2029 escaped), with every string read by the long strings' path and by the byte loop.
func FuzzCompactPieces(f *testing.F) {
	for _, body := range append(forwardedBodies, requestBodies...) {
		f.Add([]byte(body))
	}
	f.Add([]byte(`[ "a\"<" , "\\", "\u2028\u2029\u2027 \u00e9" ,{"k" : "\\u003c&"}]`))
	f.Add([]byte(`"` + strings.Repeat("w", plainStringMin) + "\\\\<\\\"&\u2028\xe2\x80\xe2\xff" + `"`))
	f.Add([]byte(`"` + stringContent(loadgen.TextRealistic.Text(1, 64)) + `"`))
	f.Fuzz(func(t *testing.T, v []byte) {
		want, err := json.Marshal(json.RawMessage(v))
		if err != nil {
			return // not one valid JSON value: appendCompact is never given one
		}
		for _, plainFrom := range []int{0, plainStringMin} {
			if got := stringEnds(nil).appendCompact([]byte("x"), v, plainFrom)[1:]; !bytes.Equal(got, want) {
				t.Fatalf("strings from %d bytes read whole: %q, encoding/json %q", plainFrom, got, want)
			}
		}
	})
}
