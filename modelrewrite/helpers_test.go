package modelrewrite

import (
	"fmt"
	"time"
)

var (
	t0   = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	pool = PoolKey{Namespace: "default", Group: DefaultPoolGroup, Name: "pool"}
)

func rewrite(name string, created time.Time, rules ...Rule) Rewrite {
	return Rewrite{Key: ObjectKey{Namespace: pool.Namespace, Name: name}, Created: created, Pool: pool, Rules: rules}
}

// exact builds a rule matching models, with unweighted targets.
func exact(models []string, targets ...string) Rule {
	r := Rule{Models: models}
	for _, t := range targets {
		r.Targets = append(r.Targets, Target{Model: t})
	}
	return r
}

func generic(targets ...string) Rule { return exact(nil, targets...) }

// weighted builds a rule for models with targets "name:weight".
func weighted(models []string, targets ...Target) Rule {
	return Rule{Models: models, Targets: targets}
}

func mustTable(tb interface {
	Helper()
	Fatalf(string, ...any)
}, rws ...Rewrite) *Table {
	tb.Helper()
	t, err := NewTable(rws)
	if err != nil {
		tb.Fatalf("NewTable: %v", err)
	}
	return t
}

func sessionKey(i int) string { return fmt.Sprintf("session-%d", i) }
