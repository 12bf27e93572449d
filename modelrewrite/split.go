package modelrewrite

import "math"

// compiledRule is a Rule ready for splitting: duplicate target models merged
// (their weights add up, as they would in the upstream weighted draw), each
// target's model hash precomputed, and the stable target resolved.
type compiledRule struct {
	id      RuleID
	targets []compiledTarget
	// stable indexes targets; -1 when the rule has no targets.
	stable int
}

type compiledTarget struct {
	model  string
	weight float64
	// hash is hashString(model); a target's rendezvous score depends on its
	// name, never on its position in the list.
	hash uint64
}

// compileRule assumes r passed Rewrite.Validate.
func compileRule(id RuleID, r Rule, stableModel string) *compiledRule {
	cr := &compiledRule{id: id, stable: -1, targets: make([]compiledTarget, 0, len(r.Targets))}
	for _, t := range r.Targets {
		w := float64(t.Weight)
		if t.Weight == 0 {
			w = 1 // unweighted targets share equally
		}
		merged := false
		for i := range cr.targets {
			if cr.targets[i].model == t.Model {
				cr.targets[i].weight += w
				merged = true
				break
			}
		}
		if !merged {
			cr.targets = append(cr.targets, compiledTarget{model: t.Model, weight: w, hash: hashString(t.Model)})
		}
	}
	for i, t := range cr.targets {
		if t.model == stableModel {
			cr.stable = i
			return cr
		}
	}
	for i, t := range cr.targets {
		if cr.stable < 0 || t.weight > cr.targets[cr.stable].weight {
			cr.stable = i
		}
	}
	return cr
}

// pick returns the index of the target with the highest weighted rendezvous
// score for keyHash; r must have targets.
//
// Score_i = w_i / -ln(u_i) with u_i uniform in (0,1) is the reciprocal of an
// exponential variable with rate w_i, so target i wins with probability
// w_i / sum(w): the weighted split. For a fixed key every u_i is fixed, so
// the choice is sticky, and changing w_i moves only keys whose winner
// changes: raising w_i can only move keys to i, lowering it can only move
// keys away from i. That is the minimal disruption a weight change allows.
// Exact score ties (identical hashes) go to the lower index.
func (r *compiledRule) pick(keyHash uint64) int {
	best, bestScore := -1, 0.0
	for i := range r.targets {
		t := &r.targets[i]
		score := t.weight / -math.Log(unitInterval(mix64(keyHash^t.hash)))
		if score > bestScore {
			best, bestScore = i, score
		}
	}
	return best
}

// hashString is 64-bit FNV-1a followed by the SplitMix64 finalizer. It is
// fixed (no per-process seed) so that every Endpoint Picker replica, before
// and after a restart, sends a session to the same target. FNV-1a is
// written out here to hash a string without converting it to []byte.
func hashString(s string) uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= prime64
	}
	return mix64(h)
}

// mix64 is the SplitMix64 finalizer: a bijection on uint64 whose every
// output bit depends on every input bit, so mix64(key ^ target) behaves as an
// independent uniform value per (key, target) pair.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// unitInterval maps h to the open interval (0,1) using its top 52 bits, so
// -ln(u) is always finite and positive. (With 53 bits, the largest value
// plus one half does not fit a float64 mantissa and rounds up to 1.)
func unitInterval(h uint64) float64 {
	return (float64(h>>12) + 0.5) * 0x1p-52
}
