package modelrewrite

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"
)

func apiRewrite(mutate func(*v1alpha2.InferenceModelRewrite)) *v1alpha2.InferenceModelRewrite {
	obj := &v1alpha2.InferenceModelRewrite{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "canary", CreationTimestamp: metav1.NewTime(t0)},
		Spec: v1alpha2.InferenceModelRewriteSpec{
			PoolRef: &v1alpha2.PoolObjectReference{Name: "pool"},
			Rules: []v1alpha2.InferenceModelRewriteRule{{
				Matches: []v1alpha2.Match{{Model: &v1alpha2.ModelMatch{Value: "llama"}}},
				Targets: []v1alpha2.TargetModel{{ModelRewrite: "llama-v1", Weight: 90}, {ModelRewrite: "llama-v2", Weight: 10}},
			}},
		},
	}
	if mutate != nil {
		mutate(obj)
	}
	return obj
}

func TestFromAPI(t *testing.T) {
	exactType := v1alpha2.MatchExact
	obj := apiRewrite(func(o *v1alpha2.InferenceModelRewrite) {
		o.Annotations = map[string]string{StableTargetAnnotation: "llama-v1"}
		o.Spec.Rules = append(o.Spec.Rules, v1alpha2.InferenceModelRewriteRule{
			Targets: []v1alpha2.TargetModel{{ModelRewrite: "fallback"}},
		})
		o.Spec.Rules[0].Matches[0].Model.Type = &exactType
	})
	got, err := FromAPI(obj)
	if err != nil {
		t.Fatalf("FromAPI: %v", err)
	}
	if got.Key != (ObjectKey{"default", "canary"}) || !got.Created.Equal(t0) || got.StableModel != "llama-v1" {
		t.Errorf("metadata: %+v", got)
	}
	if got.Pool != pool {
		t.Errorf("Pool = %+v, want %+v (defaults applied)", got.Pool, pool)
	}
	if len(got.Rules) != 2 || strings.Join(got.Rules[0].Models, ",") != "llama" || len(got.Rules[1].Models) != 0 ||
		got.Rules[0].Targets[1] != (Target{"llama-v2", 10}) || got.Rules[1].Targets[0] != (Target{"fallback", 0}) {
		t.Errorf("Rules = %+v", got.Rules)
	}
	obj.Spec.Rules[0].Matches[0].Model.Value = "changed"
	if got.Rules[0].Models[0] != "llama" {
		t.Error("the Rewrite shares memory with the object")
	}
}

func TestValidate(t *testing.T) {
	other := v1alpha2.MatchValidationType("RegularExpression")
	servedPool := func(k PoolKey) bool { return k == pool }
	tests := []struct {
		name       string
		obj        *v1alpha2.InferenceModelRewrite
		pools      func(PoolKey) bool
		wantReason Reason
		wantInMsg  string
	}{
		{name: "accepted", obj: apiRewrite(nil), pools: servedPool, wantReason: ReasonAccepted},
		{
			name: "explicit default group and kind",
			obj: apiRewrite(func(o *v1alpha2.InferenceModelRewrite) {
				o.Spec.PoolRef.Group, o.Spec.PoolRef.Kind = DefaultPoolGroup, PoolKind
			}),
			pools:      servedPool,
			wantReason: ReasonAccepted,
		},
		{
			name:  "unknown pool",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.PoolRef.Name = "elsewhere" }),
			pools: servedPool, wantReason: ReasonPoolNotFound, wantInMsg: "elsewhere",
		},
		{
			name:  "pool of another group",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.PoolRef.Group = "inference.networking.x-k8s.io" }),
			pools: servedPool, wantReason: ReasonPoolNotFound, wantInMsg: "x-k8s",
		},
		{name: "no pool lookup", obj: apiRewrite(nil), pools: nil, wantReason: ReasonPoolNotFound},
		{
			name:  "missing poolRef",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.PoolRef = nil }),
			pools: servedPool, wantReason: ReasonInvalidPoolRef, wantInMsg: "spec.poolRef",
		},
		{
			name:  "poolRef of another kind",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.PoolRef.Kind = "Service" }),
			pools: servedPool, wantReason: ReasonInvalidPoolRef, wantInMsg: "Service",
		},
		{
			name:  "match without model",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.Rules[0].Matches[0].Model = nil }),
			pools: servedPool, wantReason: ReasonInvalidMatch, wantInMsg: "spec.rules[0].matches[0].model",
		},
		{
			name:  "unsupported match type",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.Rules[0].Matches[0].Model.Type = &other }),
			pools: servedPool, wantReason: ReasonInvalidMatch, wantInMsg: "RegularExpression",
		},
		{
			name:  "invalid weight",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.Rules[0].Targets[1].Weight = -3 }),
			pools: servedPool, wantReason: ReasonInvalidWeight, wantInMsg: "spec.rules[0].targets[1].weight",
		},
		{
			name:  "mixed weights",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.Rules[0].Targets[1].Weight = 0 }),
			pools: servedPool, wantReason: ReasonMixedWeights, wantInMsg: "spec.rules[0].targets",
		},
		{
			name:  "empty target",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.Rules[0].Targets[0].ModelRewrite = "" }),
			pools: servedPool, wantReason: ReasonInvalidTarget, wantInMsg: "modelRewrite",
		},
		{
			name: "stable annotation names no target",
			obj: apiRewrite(func(o *v1alpha2.InferenceModelRewrite) {
				o.Annotations = map[string]string{StableTargetAnnotation: "nope"}
			}),
			pools: servedPool, wantReason: ReasonInvalidTarget, wantInMsg: "nope",
		},
		{name: "nil object", obj: nil, pools: servedPool, wantReason: ReasonPending},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			accepted, reason, msg := Validate(tt.obj, tt.pools)
			if accepted != (tt.wantReason == ReasonAccepted) || reason != tt.wantReason {
				t.Fatalf("Validate = (%v, %q, %q), want reason %q", accepted, reason, msg, tt.wantReason)
			}
			if msg == "" || !strings.Contains(msg, tt.wantInMsg) {
				t.Errorf("message %q does not mention %q", msg, tt.wantInMsg)
			}
		})
	}
}
