package modelrewrite

import (
	"errors"
	"fmt"

	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"
)

// The pool reference defaults the API server applies (kubebuilder:default on
// PoolObjectReference); objects built in code may leave them empty.
const (
	DefaultPoolGroup = "inference.networking.k8s.io"
	PoolKind         = "InferencePool"
)

// FromAPI converts an InferenceModelRewrite into a Rewrite and validates it.
// It returns a *ValidationError when the object cannot be accepted for its
// spec alone (whether the pool exists is Validate's concern). The Rewrite
// shares no memory with obj.
func FromAPI(obj *v1alpha2.InferenceModelRewrite) (Rewrite, error) {
	if obj == nil {
		return Rewrite{}, fmt.Errorf("modelrewrite: FromAPI called with a nil InferenceModelRewrite")
	}
	key := ObjectKey{Namespace: obj.Namespace, Name: obj.Name}
	invalid := func(reason Reason, field, format string, args ...any) error {
		return &ValidationError{Object: key, Reason: reason, Field: field, Message: fmt.Sprintf(format, args...)}
	}
	ref := obj.Spec.PoolRef
	if ref == nil {
		return Rewrite{}, invalid(ReasonInvalidPoolRef, "spec.poolRef", "is required")
	}
	group, kind := string(ref.Group), string(ref.Kind)
	if group == "" {
		group = DefaultPoolGroup
	}
	if kind == "" {
		kind = PoolKind
	}
	if kind != PoolKind {
		return Rewrite{}, invalid(ReasonInvalidPoolRef, "spec.poolRef.kind", "%q is not supported; only %s is", kind, PoolKind)
	}
	rw := Rewrite{
		Key:         key,
		Created:     obj.CreationTimestamp.Time,
		Pool:        PoolKey{Namespace: obj.Namespace, Group: group, Name: string(ref.Name)},
		StableModel: obj.Annotations[StableTargetAnnotation],
		Rules:       make([]Rule, len(obj.Spec.Rules)),
	}
	for i, apiRule := range obj.Spec.Rules {
		rule := Rule{Models: make([]string, 0, len(apiRule.Matches)), Targets: make([]Target, 0, len(apiRule.Targets))}
		for j, m := range apiRule.Matches {
			field := fmt.Sprintf("spec.rules[%d].matches[%d].model", i, j)
			if m.Model == nil {
				return Rewrite{}, invalid(ReasonInvalidMatch, field, "is required")
			}
			if m.Model.Type != nil && *m.Model.Type != v1alpha2.MatchExact {
				return Rewrite{}, invalid(ReasonInvalidMatch, field+".type", "%q is not supported; only %s is", *m.Model.Type, v1alpha2.MatchExact)
			}
			rule.Models = append(rule.Models, m.Model.Value)
		}
		for _, t := range apiRule.Targets {
			rule.Targets = append(rule.Targets, Target{Model: t.ModelRewrite, Weight: t.Weight})
		}
		rw.Rules[i] = rule
	}
	if err := rw.Validate(); err != nil {
		return Rewrite{}, err
	}
	return rw, nil
}

// Validate decides the Accepted condition of obj: accepted with
// ReasonAccepted, or not with the Reason (a closed set, see Reason) and a
// message naming the offending field; a nil obj is left Pending. poolExists reports whether a pool this
// Endpoint Picker serves exists; nil means no pool is known.
func Validate(obj *v1alpha2.InferenceModelRewrite, poolExists func(PoolKey) bool) (accepted bool, reason Reason, message string) {
	if obj == nil {
		return false, ReasonPending, "no InferenceModelRewrite to validate"
	}
	rw, err := FromAPI(obj)
	if err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) {
			return false, ve.Reason, ve.Field + ": " + ve.Message
		}
		return false, ReasonPending, err.Error()
	}
	if poolExists == nil || !poolExists(rw.Pool) {
		return false, ReasonPoolNotFound, fmt.Sprintf("spec.poolRef: InferencePool %s not found", rw.Pool)
	}
	return true, ReasonAccepted, fmt.Sprintf("%d rules in effect for InferencePool %s, subject to precedence across rewrites", len(rw.Rules), rw.Pool)
}
