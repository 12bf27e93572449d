package modelrewrite

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// benchTable holds 100 rewrite objects for one pool: each has an exact rule
// with a 90/10 canary split for its own model and a generic rule (only the
// oldest generic one is in effect), as a busy cluster would.
func benchTable(b *testing.B) *Table {
	rws := make([]Rewrite, 100)
	for i := range rws {
		rws[i] = rewrite(fmt.Sprintf("rw-%03d", i), t0.Add(time.Duration(i%10)*time.Second),
			weighted([]string{fmt.Sprintf("model-%d", i)}, Target{fmt.Sprintf("model-%d-v1", i), 90}, Target{fmt.Sprintf("model-%d-v2", i), 10}),
			generic(fmt.Sprintf("fallback-%d", i)),
		)
	}
	return mustTable(b, rws...)
}

// BenchmarkDecide: lookup and choice among 100 rewrite objects.
func BenchmarkDecide(b *testing.B) {
	table := benchTable(b)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%08x", i*2654435761)
	}
	guard, err := NewGuardrail(GuardrailConfig{})
	if err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name  string
		key   bool
		model string
		trips TripChecker
	}{
		{"exact/keyed", true, "model-57", nil},
		{"exact/keyless", false, "model-57", nil},
		{"exact/keyed+guardrail", true, "model-57", guard},
		{"generic/keyed", true, "unlisted", nil},
		{"no-pool-match", true, "model-57", nil},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			req := Request{Pool: pool, Model: c.model}
			if c.name == "no-pool-match" {
				req.Pool.Name = "other"
			}
			src := rand.NewPCG(1, 2)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if c.key {
					req.SessionKey = keys[i&1023]
				}
				i++
				_ = table.Decide(req, src, c.trips)
			}
		})
	}
}

func BenchmarkDecideParallel(b *testing.B) {
	table := benchTable(b)
	guard, err := NewGuardrail(GuardrailConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			_ = table.Decide(Request{Pool: pool, Model: "model-57", SessionKey: "user-0001"}, nil, guard)
		}
	})
}

func BenchmarkNewTable100(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		benchTable(b)
	}
}

func BenchmarkSessionKey(b *testing.B) {
	sk, err := NewSessionKeys("")
	if err != nil {
		b.Fatal(err)
	}
	headers := map[string]string{":path": "/v1/chat/completions", "content-type": "application/json", "x-session-id": "abc-123"}
	body := map[string]any{"model": "llama", "user": "u-1"}
	b.ReportAllocs()
	for b.Loop() {
		_ = sk.Key(headers, body)
	}
}

// BenchmarkGuardrailRecord: one stable and one canary outcome per op.
func BenchmarkGuardrailRecord(b *testing.B) {
	g, err := NewGuardrail(GuardrailConfig{})
	if err != nil {
		b.Fatal(err)
	}
	stable, canary := served("stable"), served("canary")
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		g.Record(stable, false, now)
		g.Record(canary, false, now)
	}
}
