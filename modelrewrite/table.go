package modelrewrite

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// Table is an immutable, precedence-resolved index of rewrites: for each pool
// it holds the winning rule per exact model name and the winning generic
// rule, so a lookup is one map access.
type Table struct {
	pools map[PoolKey]*poolRules
}

type poolRules struct {
	exact   map[string]*compiledRule
	generic *compiledRule
}

// NewTable resolves precedence across rewrites as the API's "Precedence and
// Conflict Resolution" section requires, for each pool separately:
//
//  1. A rule with an Exact match for the request's model beats every generic
//     rule (a rule with no matches), in any object, even a generic rule that
//     comes earlier in the same object.
//  2. Among rules of the same class, the oldest object (Created) wins.
//  3. Within one object, the first rule in list order wins.
//
// Objects created at the same instant (creation timestamps have one-second
// resolution, so ties are common) are ordered by namespace, then name, which
// makes the result independent of input order.
//
// Rewrites that fail Rewrite.Validate, and repeats of an ObjectKey already
// seen earlier in rewrites, are left out of the Table; the returned error
// joins one error per rewrite left out and is nil when none was. The Table is
// always usable, so one bad object never disables the others.
func NewTable(rewrites []Rewrite) (*Table, error) {
	var errs []error
	seen := make(map[ObjectKey]bool, len(rewrites))
	ordered := make([]*Rewrite, 0, len(rewrites))
	for i := range rewrites {
		rw := &rewrites[i]
		if seen[rw.Key] {
			errs = append(errs, fmt.Errorf("InferenceModelRewrite %s: listed more than once; the first is used", rw.Key))
			continue
		}
		seen[rw.Key] = true
		if err := rw.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		ordered = append(ordered, rw)
	}
	slices.SortFunc(ordered, comparePrecedence)

	t := &Table{pools: make(map[PoolKey]*poolRules)}
	for _, rw := range ordered {
		pr := t.pools[rw.Pool]
		if pr == nil {
			pr = &poolRules{exact: make(map[string]*compiledRule)}
			t.pools[rw.Pool] = pr
		}
		for i, rule := range rw.Rules {
			// Compile lazily: a rule shadowed for all its models is never used.
			var cr *compiledRule
			compiled := func() *compiledRule {
				if cr == nil {
					cr = compileRule(RuleID{Object: rw.Key, Index: i}, rule, rw.StableModel)
				}
				return cr
			}
			if len(rule.Models) == 0 {
				if pr.generic == nil {
					pr.generic = compiled()
				}
				continue
			}
			for _, m := range rule.Models {
				if _, taken := pr.exact[m]; !taken {
					pr.exact[m] = compiled()
				}
			}
		}
	}
	return t, errors.Join(errs...)
}

// comparePrecedence orders rewrites from highest to lowest precedence.
func comparePrecedence(a, b *Rewrite) int {
	return cmp.Or(
		a.Created.Compare(b.Created),
		cmp.Compare(a.Key.Namespace, b.Key.Namespace),
		cmp.Compare(a.Key.Name, b.Key.Name),
	)
}

// lookup returns the rule that applies to model in pool, or nil.
func (t *Table) lookup(pool PoolKey, model string) *compiledRule {
	if t == nil {
		return nil
	}
	pr := t.pools[pool]
	if pr == nil {
		return nil
	}
	if cr := pr.exact[model]; cr != nil {
		return cr
	}
	return pr.generic
}
