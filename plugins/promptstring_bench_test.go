package plugins

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// BenchmarkPromptStringPasses times each pass Sluice's request path makes over a long prompt's JSON string, alone:
// the validation (validJSON), the end found by the member split (skipString), the content decoded for the API type
// and the prefix cache (unquoteString), and the forwarded body's compaction (appendCompact). The prompt is the load
// generator's text, words and realistic (long-prompt and long-prompt-text), encoded as clients encode it: the
// difference between the two is what a real prompt's escapes, <, &, and non-ASCII characters cost each pass.
//
//	go test -run '^$' -bench PromptStringPasses -benchmem ./plugins/
func BenchmarkPromptStringPasses(b *testing.B) {
	for _, text := range []loadgen.PromptText{loadgen.TextWords, loadgen.TextRealistic} {
		for _, kb := range []int{8, 64, 256} {
			var enc bytes.Buffer
			encoder := json.NewEncoder(&enc)
			encoder.SetEscapeHTML(false)
			if err := encoder.Encode(text.Text(1, kb<<10/loadgen.CharsPerToken)); err != nil {
				b.Fatal(err)
			}
			token := bytes.TrimSuffix(enc.Bytes(), []byte("\n"))
			dst := make([]byte, 0, 2*len(token))
			passes := []struct {
				name string
				pass func()
			}{
				{"validJSON", func() { validJSON(token) }},
				{"skipString", func() { skipString(token, 0) }},
				{"unquoteString", func() { _, _ = unquoteString(token) }},
				{"appendCompact", func() { dst = stringEnds(nil).appendCompact(dst[:0], token, plainStringMin) }},
			}
			for _, p := range passes {
				b.Run(fmt.Sprintf("text=%s/prompt=%dKB/pass=%s", text, kb, p.name), func(b *testing.B) {
					b.SetBytes(int64(len(token)))
					b.ReportAllocs()
					for range b.N {
						p.pass()
					}
				})
			}
		}
	}
}
