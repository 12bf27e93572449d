package modelrewrite

import (
	"fmt"
	"strconv"
	"time"
)

// StableTargetAnnotation on an InferenceModelRewrite names its stable target
// model (Rewrite.StableModel). Set it when a canary's weight will grow past
// the stable model's, so the guardrail keeps comparing against the right one.
const StableTargetAnnotation = "modelrewrite.sluice.dev/stable-target"

// ClearGuardrailAnnotation on an InferenceModelRewrite is the operator's way
// to clear the guardrail (see Guardrail.Clear): whenever its value changes
// (any new value, e.g. a timestamp), every tripped target of the object's
// rules gets its share back and is judged on fresh outcomes. The annotation
// stays; only a change counts, so every Endpoint Picker acts on each value
// once, also after a restart or a leader change.
const ClearGuardrailAnnotation = "modelrewrite.sluice.dev/clear-guardrail"

// MaxWeight is the largest weight a target may carry (the API's
// kubebuilder:validation:Maximum).
const MaxWeight = 1_000_000

// PoolKey identifies an InferencePool. A rewrite can only reference a pool in
// its own namespace, so Namespace is the rewrite's namespace.
type PoolKey struct {
	Namespace string
	Group     string
	Name      string
}

// String renders the key as "namespace/name (group)" for messages.
func (k PoolKey) String() string {
	return k.Namespace + "/" + k.Name + " (" + k.Group + ")"
}

// ObjectKey identifies a rewrite object.
type ObjectKey struct {
	Namespace string
	Name      string
}

// String renders the key as "namespace/name".
func (k ObjectKey) String() string { return k.Namespace + "/" + k.Name }

// RuleID identifies one rule: the object that holds it and its index in
// spec.rules. Editing an object's rule list can give an index to a different
// rule; consumers that keep state per rule (Guardrail) key it by RuleID and
// target model together, so state only carries over while the target
// survives at that index.
type RuleID struct {
	Object ObjectKey
	Index  int
}

// String renders the ID as "namespace/name/rules[i]".
func (id RuleID) String() string {
	return id.Object.String() + "/rules[" + strconv.Itoa(id.Index) + "]"
}

// Rewrite is the plain form of one InferenceModelRewrite object.
type Rewrite struct {
	Key     ObjectKey
	Created time.Time
	Pool    PoolKey
	// StableModel, when set, names the stable target of every rule that
	// lists it (see Rule). Empty means each rule's stable target is its
	// heaviest target.
	StableModel string
	Rules       []Rule
}

// Rule matches requests by model and splits them across Targets.
//
// The stable target of a rule is StableModel of its Rewrite when the rule
// lists that model, else the target with the highest weight, the first in
// list order on ties (so, for unweighted targets, the first one). The
// guardrail compares every other target against it and sends a tripped
// target's share to it.
type Rule struct {
	// Models lists exact model names; a request matches when its model
	// equals ANY of them. Empty means the rule matches every model
	// (a generic rule).
	Models []string
	// Targets are the weighted destinations. Empty means the rule matches
	// but leaves the model unchanged, which lets an exact rule exempt a
	// model from a generic one.
	Targets []Target
}

// Target is a weighted model destination. Weight 0 means "unset": either
// every target of a rule sets a weight in [1, MaxWeight] or none does, and
// unweighted targets share traffic equally.
type Target struct {
	Model  string
	Weight int32
}

// Reason is the closed set of reasons for the Accepted condition of an
// InferenceModelRewrite. Accepted and the pending state are the upstream
// reasons; the others say why an object was not accepted.
type Reason string

const (
	// ReasonAccepted: the object is valid and its rules are in effect
	// (subject to precedence against other objects).
	ReasonAccepted Reason = "Accepted"
	// ReasonPending: not reconciled yet (the upstream default).
	ReasonPending Reason = "Pending"
	// ReasonInvalidPoolRef: spec.poolRef is missing, has an empty name, or
	// is not an InferencePool.
	ReasonInvalidPoolRef Reason = "InvalidPoolRef"
	// ReasonPoolNotFound: spec.poolRef names a pool that does not exist (or
	// that this Endpoint Picker does not serve).
	ReasonPoolNotFound Reason = "PoolNotFound"
	// ReasonInvalidMatch: a match has no model, an empty value, or a match
	// type other than Exact.
	ReasonInvalidMatch Reason = "InvalidMatch"
	// ReasonInvalidTarget: a target has an empty model, or the stable-target
	// annotation names a model that no rule targets.
	ReasonInvalidTarget Reason = "InvalidTarget"
	// ReasonInvalidWeight: a weight is outside [1, MaxWeight] (0 = unset).
	ReasonInvalidWeight Reason = "InvalidWeight"
	// ReasonMixedWeights: some targets of a rule set a weight and others
	// do not.
	ReasonMixedWeights Reason = "MixedWeights"
)

// ValidationError says why a rewrite is not acceptable. Reason is from the
// closed set above; Field is the JSON path of the offending field.
type ValidationError struct {
	Object  ObjectKey
	Reason  Reason
	Field   string
	Message string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("InferenceModelRewrite %s: %s: %s: %s", e.Object, e.Reason, e.Field, e.Message)
}

// Validate checks the spec of rw (not whether its pool exists; see the
// package-level Validate for that). It returns nil or a *ValidationError.
func (rw *Rewrite) Validate() error {
	invalid := func(reason Reason, field, format string, args ...any) error {
		return &ValidationError{Object: rw.Key, Reason: reason, Field: field, Message: fmt.Sprintf(format, args...)}
	}
	if rw.Pool.Name == "" {
		return invalid(ReasonInvalidPoolRef, "spec.poolRef.name", "must name an InferencePool")
	}
	stableFound := rw.StableModel == ""
	for i, rule := range rw.Rules {
		for j, m := range rule.Models {
			if m == "" {
				return invalid(ReasonInvalidMatch, fmt.Sprintf("spec.rules[%d].matches[%d].model.value", i, j), "must not be empty")
			}
		}
		weighted, unweighted := 0, 0
		for j, t := range rule.Targets {
			field := fmt.Sprintf("spec.rules[%d].targets[%d]", i, j)
			if t.Model == "" {
				return invalid(ReasonInvalidTarget, field+".modelRewrite", "must not be empty")
			}
			switch {
			case t.Weight == 0:
				unweighted++
			case t.Weight < 0 || t.Weight > MaxWeight:
				return invalid(ReasonInvalidWeight, field+".weight", "%d is outside [1, %d]", t.Weight, MaxWeight)
			default:
				weighted++
			}
			if t.Model == rw.StableModel {
				stableFound = true
			}
		}
		if weighted > 0 && unweighted > 0 {
			return invalid(ReasonMixedWeights, fmt.Sprintf("spec.rules[%d].targets", i),
				"%d targets set a weight and %d do not; set a weight on all targets or on none", weighted, unweighted)
		}
	}
	if !stableFound {
		return invalid(ReasonInvalidTarget, "metadata.annotations["+StableTargetAnnotation+"]",
			"stable target %q is not a target of any rule", rw.StableModel)
	}
	return nil
}
