package rewritecontroller

import (
	"errors"
	"fmt"

	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/sluice-gw/sluice/modelrewrite"
)

// FromAPI converts an InferenceModelRewrite into a modelrewrite.Rewrite and validates it.
// It returns a *modelrewrite.ValidationError when the object cannot be accepted for its
// spec alone (whether the pool exists is Validate's concern). The modelrewrite.Rewrite
// shares no memory with obj.
func FromAPI(obj *v1alpha2.InferenceModelRewrite) (modelrewrite.Rewrite, error) {
	if obj == nil {
		return modelrewrite.Rewrite{}, fmt.Errorf("modelrewrite: FromAPI called with a nil InferenceModelRewrite")
	}
	key := modelrewrite.ObjectKey{Namespace: obj.Namespace, Name: obj.Name}
	invalid := func(reason modelrewrite.Reason, field, format string, args ...any) error {
		return &modelrewrite.ValidationError{Object: key, Reason: reason, Field: field, Message: fmt.Sprintf(format, args...)}
	}
	ref := obj.Spec.PoolRef
	if ref == nil {
		return modelrewrite.Rewrite{}, invalid(modelrewrite.ReasonInvalidPoolRef, "spec.poolRef", "is required")
	}
	group, kind := string(ref.Group), string(ref.Kind)
	if group == "" {
		group = modelrewrite.DefaultPoolGroup
	}
	if kind == "" {
		kind = modelrewrite.PoolKind
	}
	if kind != modelrewrite.PoolKind {
		return modelrewrite.Rewrite{}, invalid(modelrewrite.ReasonInvalidPoolRef, "spec.poolRef.kind", "%q is not supported; only %s is", kind, modelrewrite.PoolKind)
	}
	rw := modelrewrite.Rewrite{
		Key:         key,
		Created:     obj.CreationTimestamp.Time,
		Pool:        modelrewrite.PoolKey{Namespace: obj.Namespace, Group: group, Name: string(ref.Name)},
		StableModel: obj.Annotations[modelrewrite.StableTargetAnnotation],
		Rules:       make([]modelrewrite.Rule, len(obj.Spec.Rules)),
	}
	for i, apiRule := range obj.Spec.Rules {
		rule := modelrewrite.Rule{Models: make([]string, 0, len(apiRule.Matches)), Targets: make([]modelrewrite.Target, 0, len(apiRule.Targets))}
		for j, m := range apiRule.Matches {
			field := fmt.Sprintf("spec.rules[%d].matches[%d].model", i, j)
			if m.Model == nil {
				return modelrewrite.Rewrite{}, invalid(modelrewrite.ReasonInvalidMatch, field, "is required")
			}
			if m.Model.Type != nil && *m.Model.Type != v1alpha2.MatchExact {
				return modelrewrite.Rewrite{}, invalid(modelrewrite.ReasonInvalidMatch, field+".type", "%q is not supported; only %s is", *m.Model.Type, v1alpha2.MatchExact)
			}
			rule.Models = append(rule.Models, m.Model.Value)
		}
		for _, t := range apiRule.Targets {
			rule.Targets = append(rule.Targets, modelrewrite.Target{Model: t.ModelRewrite, Weight: t.Weight})
		}
		rw.Rules[i] = rule
	}
	if err := rw.Validate(); err != nil {
		return modelrewrite.Rewrite{}, err
	}
	return rw, nil
}

// Validate decides the Accepted condition of obj: accepted with
// ReasonAccepted, or not with the Reason (a closed set, see modelrewrite.Reason) and a
// message naming the offending field; a nil obj is left Pending. poolExists reports whether a pool this
// Endpoint Picker serves exists; nil means no pool is known.
func Validate(obj *v1alpha2.InferenceModelRewrite, poolExists func(modelrewrite.PoolKey) bool) (accepted bool, reason modelrewrite.Reason, message string) {
	if obj == nil {
		return false, modelrewrite.ReasonPending, "no InferenceModelRewrite to validate"
	}
	rw, err := FromAPI(obj)
	if err != nil {
		var ve *modelrewrite.ValidationError
		if errors.As(err, &ve) {
			return false, ve.Reason, ve.Field + ": " + ve.Message
		}
		return false, modelrewrite.ReasonPending, err.Error()
	}
	if poolExists == nil || !poolExists(rw.Pool) {
		return false, modelrewrite.ReasonPoolNotFound, fmt.Sprintf("spec.poolRef: InferencePool %s not found", rw.Pool)
	}
	return true, modelrewrite.ReasonAccepted, fmt.Sprintf("%d rules in effect for InferencePool %s, subject to precedence across rewrites", len(rw.Rules), rw.Pool)
}
