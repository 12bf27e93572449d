package modelrewrite

import "math/rand/v2"

// Request is what Decide needs to know about a request.
type Request struct {
	// Pool is the InferencePool the request is for.
	Pool PoolKey
	// Model is the "model" field of the request body.
	Model string
	// SessionKey pins the request's session to a target; empty means the
	// request has no session and is split by weight at random. See
	// SessionKeys.
	SessionKey string
}

// DecisionKind says how a Decision was reached. Its String values are the
// closed set used as a metric label.
type DecisionKind uint8

const (
	// KindNoMatch: no rule applies; the model is unchanged.
	KindNoMatch DecisionKind = iota
	// KindUnchanged: a rule applies but has no targets; the model is
	// unchanged.
	KindUnchanged
	// KindSticky: the target was chosen by hashing the session key.
	KindSticky
	// KindWeighted: the request had no session key; the target was drawn at
	// random by weight.
	KindWeighted
	// KindDiverted: the split chose a target whose guardrail is tripped, so
	// the request goes to the rule's stable target instead.
	KindDiverted
	numDecisionKinds = iota
)

var decisionKindNames = [numDecisionKinds]string{"no_match", "unchanged", "sticky", "weighted", "diverted"}

func (k DecisionKind) String() string {
	if int(k) < len(decisionKindNames) {
		return decisionKindNames[k]
	}
	return "unknown"
}

// Decision is the outcome of Table.Decide. Keep it with the request: the
// guardrail and the recorder take it again when the response is known.
type Decision struct {
	Kind DecisionKind
	// Rule is the rule that applied; zero for KindNoMatch.
	Rule RuleID
	// Model is the model the request must be sent with. It is never empty
	// when the request's model was not.
	Model string
	// Chosen is the target the split picked; it differs from Model only for
	// KindDiverted. Empty when no target was picked.
	Chosen string
	// Stable is the rule's stable target; empty when no target was picked.
	Stable string
}

// Rewritten reports whether Model differs from the request's model because
// a rule applied.
func (d Decision) Rewritten() bool { return d.Kind >= KindSticky }

// TripChecker reports whether the guardrail has taken target of rule out of
// the split. *Guardrail implements it.
type TripChecker interface {
	Tripped(rule RuleID, target string) bool
}

// Decide chooses the model for req.
//
// A request with a session key gets the weighted rendezvous choice for that
// key: the same target every time while the rule's targets and weights stay
// the same. A request without one draws the hash input from src, which
// gives the weighted split in expectation; nil src means the goroutine-safe
// global generator of math/rand/v2. trips may be nil (no guardrail); when it
// reports the chosen target as tripped, the request goes to the stable
// target. Decide is safe for concurrent use if src is.
func (t *Table) Decide(req Request, src rand.Source, trips TripChecker) Decision {
	cr := t.lookup(req.Pool, req.Model)
	if cr == nil {
		return Decision{Kind: KindNoMatch, Model: req.Model}
	}
	if len(cr.targets) == 0 {
		return Decision{Kind: KindUnchanged, Rule: cr.id, Model: req.Model}
	}
	kind := KindSticky
	if req.SessionKey == "" {
		kind = KindWeighted
	}
	pick := 0
	if len(cr.targets) > 1 {
		var keyHash uint64
		switch {
		case req.SessionKey != "":
			keyHash = hashString(req.SessionKey)
		case src != nil:
			keyHash = src.Uint64()
		default:
			keyHash = rand.Uint64()
		}
		pick = cr.pick(keyHash)
	}
	chosen := cr.targets[pick].model
	stable := cr.targets[cr.stable].model
	d := Decision{Kind: kind, Rule: cr.id, Model: chosen, Chosen: chosen, Stable: stable}
	if chosen != stable && trips != nil && trips.Tripped(cr.id, chosen) {
		d.Kind, d.Model = KindDiverted, stable
	}
	return d
}
