package modelrewrite

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestPrecedence follows the "Precedence and Conflict Resolution" section of
// InferenceModelRewriteSpec: Exact over generic, then the oldest object, then
// the first rule in list order; plus Sluice's tie-break on namespace/name.
func TestPrecedence(t *testing.T) {
	older, newer := t0, t0.Add(time.Minute)
	tests := []struct {
		name     string
		rewrites []Rewrite
		model    string
		want     Decision // Kind, Rule and Model are compared
	}{
		{
			name:     "exact match rewrites",
			rewrites: []Rewrite{rewrite("a", older, exact([]string{"llama"}, "llama-v2"))},
			model:    "llama",
			want:     Decision{Kind: KindSticky, Rule: RuleID{ObjectKey{"default", "a"}, 0}, Model: "llama-v2"},
		},
		{
			name:     "no rule applies",
			rewrites: []Rewrite{rewrite("a", older, exact([]string{"llama"}, "llama-v2"))},
			model:    "mistral",
			want:     Decision{Kind: KindNoMatch, Model: "mistral"},
		},
		{
			name:     "any of several matches (OR)",
			rewrites: []Rewrite{rewrite("a", older, exact([]string{"llama", "mistral"}, "merged"))},
			model:    "mistral",
			want:     Decision{Kind: KindSticky, Rule: RuleID{ObjectKey{"default", "a"}, 0}, Model: "merged"},
		},
		{
			name: "exact in a newer object beats generic in an older one",
			rewrites: []Rewrite{
				rewrite("old-generic", older, generic("fallback")),
				rewrite("new-exact", newer, exact([]string{"llama"}, "llama-v2")),
			},
			model: "llama",
			want:  Decision{Kind: KindSticky, Rule: RuleID{ObjectKey{"default", "new-exact"}, 0}, Model: "llama-v2"},
		},
		{
			name:     "exact beats an earlier generic rule of the same object",
			rewrites: []Rewrite{rewrite("a", older, generic("fallback"), exact([]string{"llama"}, "llama-v2"))},
			model:    "llama",
			want:     Decision{Kind: KindSticky, Rule: RuleID{ObjectKey{"default", "a"}, 1}, Model: "llama-v2"},
		},
		{
			name:     "generic applies to models without an exact rule",
			rewrites: []Rewrite{rewrite("a", older, generic("fallback"), exact([]string{"llama"}, "llama-v2"))},
			model:    "mistral",
			want:     Decision{Kind: KindSticky, Rule: RuleID{ObjectKey{"default", "a"}, 0}, Model: "fallback"},
		},
		{
			name: "oldest object wins among exact matches",
			rewrites: []Rewrite{
				rewrite("a-new", newer, exact([]string{"llama"}, "from-new")),
				rewrite("z-old", older, exact([]string{"llama"}, "from-old")),
			},
			model: "llama",
			want:  Decision{Kind: KindSticky, Rule: RuleID{ObjectKey{"default", "z-old"}, 0}, Model: "from-old"},
		},
		{
			name: "oldest object wins among generic rules",
			rewrites: []Rewrite{
				rewrite("a-new", newer, generic("from-new")),
				rewrite("z-old", older, generic("from-old")),
			},
			model: "anything",
			want:  Decision{Kind: KindSticky, Rule: RuleID{ObjectKey{"default", "z-old"}, 0}, Model: "from-old"},
		},
		{
			name: "timestamp tie goes to the lower name",
			rewrites: []Rewrite{
				rewrite("b", older, exact([]string{"llama"}, "from-b")),
				rewrite("a", older, exact([]string{"llama"}, "from-a")),
			},
			model: "llama",
			want:  Decision{Kind: KindSticky, Rule: RuleID{ObjectKey{"default", "a"}, 0}, Model: "from-a"},
		},
		{
			name: "timestamp tie among generic rules goes to the lower name",
			rewrites: []Rewrite{
				rewrite("b", older, generic("from-b")),
				rewrite("a", older, generic("from-a")),
			},
			model: "anything",
			want:  Decision{Kind: KindSticky, Rule: RuleID{ObjectKey{"default", "a"}, 0}, Model: "from-a"},
		},
		{
			name:     "first rule in list order wins within one object",
			rewrites: []Rewrite{rewrite("a", older, exact([]string{"llama"}, "first"), exact([]string{"llama"}, "second"))},
			model:    "llama",
			want:     Decision{Kind: KindSticky, Rule: RuleID{ObjectKey{"default", "a"}, 0}, Model: "first"},
		},
		{
			name:     "first generic rule wins within one object",
			rewrites: []Rewrite{rewrite("a", older, generic("first"), generic("second"))},
			model:    "anything",
			want:     Decision{Kind: KindSticky, Rule: RuleID{ObjectKey{"default", "a"}, 0}, Model: "first"},
		},
		{
			name: "a later rule still wins for the models the first does not list",
			rewrites: []Rewrite{rewrite("a", older,
				exact([]string{"llama"}, "first"),
				exact([]string{"llama", "mistral"}, "second"))},
			model: "mistral",
			want:  Decision{Kind: KindSticky, Rule: RuleID{ObjectKey{"default", "a"}, 1}, Model: "second"},
		},
		{
			name: "exact rule without targets exempts a model from the generic rule",
			rewrites: []Rewrite{
				rewrite("a", older, generic("fallback")),
				rewrite("b", newer, exact([]string{"llama"})),
			},
			model: "llama",
			want:  Decision{Kind: KindUnchanged, Rule: RuleID{ObjectKey{"default", "b"}, 0}, Model: "llama"},
		},
		{
			name: "rewrites for another pool do not apply",
			rewrites: []Rewrite{func() Rewrite {
				rw := rewrite("a", older, generic("fallback"))
				rw.Pool.Name = "other-pool"
				return rw
			}()},
			model: "llama",
			want:  Decision{Kind: KindNoMatch, Model: "llama"},
		},
		{
			name: "rewrites for a same-named pool in another namespace do not apply",
			rewrites: []Rewrite{func() Rewrite {
				rw := rewrite("a", older, generic("fallback"))
				rw.Key.Namespace, rw.Pool.Namespace = "other", "other"
				return rw
			}()},
			model: "llama",
			want:  Decision{Kind: KindNoMatch, Model: "llama"},
		},
		{
			name:     "no rewrites",
			rewrites: nil,
			model:    "llama",
			want:     Decision{Kind: KindNoMatch, Model: "llama"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Every order of the input must give the same answer.
			for perm := range permutations(len(tt.rewrites)) {
				in := make([]Rewrite, len(perm))
				for i, p := range perm {
					in[i] = tt.rewrites[p]
				}
				got := mustTable(t, in...).Decide(Request{Pool: pool, Model: tt.model, SessionKey: "s"}, nil, nil)
				if got.Kind != tt.want.Kind || got.Rule != tt.want.Rule || got.Model != tt.want.Model {
					t.Fatalf("input order %v: Decide = {%v %v %q}, want {%v %v %q}",
						perm, got.Kind, got.Rule, got.Model, tt.want.Kind, tt.want.Rule, tt.want.Model)
				}
			}
		})
	}
}

// permutations yields every permutation of 0..n-1 (n is small here).
func permutations(n int) func(func([]int) bool) {
	return func(yield func([]int) bool) {
		p := make([]int, n)
		for i := range p {
			p[i] = i
		}
		var gen func(k int) bool
		gen = func(k int) bool {
			if k == n {
				return yield(append([]int(nil), p...))
			}
			for i := k; i < n; i++ {
				p[k], p[i] = p[i], p[k]
				if !gen(k + 1) {
					return false
				}
				p[k], p[i] = p[i], p[k]
			}
			return true
		}
		gen(0)
	}
}

// TestPrecedenceRandomized checks, over seeded random sets of rewrites, that
// the decision equals a brute-force reading of the API text and does not
// depend on input order.
func TestPrecedenceRandomized(t *testing.T) {
	const seed = 20250601
	rng := rand.New(rand.NewPCG(seed, seed))
	t.Logf("seed %d", seed)
	models := []string{"m0", "m1", "m2", "m3"}
	for iter := 0; iter < 300; iter++ {
		var rws []Rewrite
		for o := 0; o < 1+rng.IntN(6); o++ {
			created := t0.Add(time.Duration(rng.IntN(3)) * time.Second) // frequent ties
			var rules []Rule
			for r := 0; r < 1+rng.IntN(3); r++ {
				var match []string
				if rng.IntN(3) > 0 {
					for _, m := range models {
						if rng.IntN(3) == 0 {
							match = append(match, m)
						}
					}
				}
				rules = append(rules, exact(match, "target"))
			}
			rws = append(rws, rewrite(string(rune('a'+o)), created, rules...))
		}
		table := mustTable(t, rws...)
		shuffled := append([]Rewrite(nil), rws...)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		table2 := mustTable(t, shuffled...)
		for _, m := range append(models, "unlisted") {
			req := Request{Pool: pool, Model: m, SessionKey: "k"}
			got, got2 := table.Decide(req, nil, nil), table2.Decide(req, nil, nil)
			want, ok := bruteForceRule(rws, m)
			if got != got2 {
				t.Fatalf("iter %d model %s: decision depends on input order: %+v vs %+v", iter, m, got, got2)
			}
			if !ok {
				if got.Kind != KindNoMatch {
					t.Fatalf("iter %d model %s: got %+v, want no match", iter, m, got)
				}
				continue
			}
			if got.Rule != want {
				t.Fatalf("iter %d model %s: rule %v, want %v (rewrites %+v)", iter, m, got.Rule, want, rws)
			}
		}
	}
}

// bruteForceRule applies the API's precedence by scanning every rule.
func bruteForceRule(rws []Rewrite, model string) (RuleID, bool) {
	better := func(a, b *Rewrite) bool { // a has precedence over b
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.Key.Namespace+"/"+a.Key.Name < b.Key.Namespace+"/"+b.Key.Name
	}
	for _, wantExact := range []bool{true, false} {
		var best *Rewrite
		bestIdx := -1
		for i := range rws {
			for ri, r := range rws[i].Rules {
				matches := false
				if wantExact {
					for _, m := range r.Models {
						matches = matches || m == model
					}
				} else {
					matches = len(r.Models) == 0
				}
				if !matches {
					continue
				}
				if best == nil || better(&rws[i], best) {
					best, bestIdx = &rws[i], ri
				}
				break // first matching rule of this object
			}
		}
		if best != nil {
			return RuleID{Object: best.Key, Index: bestIdx}, true
		}
	}
	return RuleID{}, false
}

func TestNewTableLeavesOutBadRewrites(t *testing.T) {
	good := rewrite("good", t0, exact([]string{"llama"}, "llama-v2"))
	bad := rewrite("bad", t0.Add(-time.Hour), generic("x", ""))
	dup := rewrite("good", t0.Add(-time.Hour), exact([]string{"llama"}, "imposter"))
	table, err := NewTable([]Rewrite{good, bad, dup})
	if err == nil {
		t.Fatal("NewTable: want an error for the invalid and the duplicate rewrite")
	}
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Object != bad.Key || ve.Reason != ReasonInvalidTarget {
		t.Errorf("error %v: want a ValidationError for %s", err, bad.Key)
	}
	if !strings.Contains(err.Error(), "listed more than once") {
		t.Errorf("error %v: want the duplicate named", err)
	}
	if d := table.Decide(Request{Pool: pool, Model: "llama"}, rand.NewPCG(1, 2), nil); d.Model != "llama-v2" {
		t.Errorf("llama -> %q, want llama-v2 from the valid rewrite", d.Model)
	}
	if d := table.Decide(Request{Pool: pool, Model: "other"}, rand.NewPCG(1, 2), nil); d.Kind != KindNoMatch {
		t.Errorf("other -> %+v, want no match (the invalid generic rule must be left out)", d)
	}
}

func TestNilTableMatchesNothing(t *testing.T) {
	var table *Table
	if d := table.Decide(Request{Pool: pool, Model: "llama"}, nil, nil); d.Kind != KindNoMatch || d.Model != "llama" {
		t.Errorf("nil Table: Decide = %+v, want no match keeping the model", d)
	}
}
