package plugins

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/modelrewrite"
	"github.com/sluice-gw/sluice/runner/runnertest"
)

// BenchmarkModelRewriteChoose: the per-request cost of model selection with
// 100 rewrite objects in force, for chat bodies of 1 KiB and of 2k, 16k and
// 64k tokens (8, 64 and 256 KiB), beside decoding the body into a map as
// upstream's parser then does anyway.
func BenchmarkModelRewriteChoose(b *testing.B) {
	rws := make([]modelrewrite.Rewrite, 100)
	for i := range rws {
		rws[i] = modelrewrite.Rewrite{
			Key: modelrewrite.ObjectKey{Namespace: "default", Name: fmt.Sprintf("rw-%03d", i)}, Created: rwT0.Add(time.Duration(i) * time.Second), Pool: rwPool,
			Rules: []modelrewrite.Rule{{Models: []string{fmt.Sprintf("model-%d", i)}, Targets: []modelrewrite.Target{{Model: fmt.Sprintf("model-%d-v1", i), Weight: 90}, {Model: fmt.Sprintf("model-%d-v2", i), Weight: 10}}}},
		}
	}
	table, err := modelrewrite.NewTable(rws)
	if err != nil {
		b.Fatal(err)
	}
	m, err := NewModelRewrite(ModelRewriteConfig{Pool: rwPool})
	if err != nil {
		b.Fatal(err)
	}
	m.SetTable(table)
	headers := map[string]string{":path": "/v1/chat/completions", "content-type": "application/json", "x-session-id": "user-42"}
	for _, size := range []int{1 << 10, 8 << 10, 64 << 10, 256 << 10} {
		body, err := json.Marshal(map[string]any{"model": "model-57", "stream": true, "max_tokens": 128,
			"messages": []map[string]string{{"role": "user", "content": strings.Repeat("tok ", size/4)}}})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("choose/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			stop := runnertest.CPUPerOp(b)
			for b.Loop() {
				if _, ok := m.Choose(headers, body); !ok {
					b.Fatal("not rewritten")
				}
			}
			stop()
		})
		b.Run(fmt.Sprintf("upstream-decode/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var v map[string]any
				if err := json.Unmarshal(body, &v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
