package rewritecontroller

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/sluice-gw/sluice/modelrewrite"
)

var (
	convertT0   = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	convertPool = modelrewrite.PoolKey{Namespace: "default", Group: modelrewrite.DefaultPoolGroup, Name: "pool"}
)

func apiRewrite(mutate func(*v1alpha2.InferenceModelRewrite)) *v1alpha2.InferenceModelRewrite {
	obj := &v1alpha2.InferenceModelRewrite{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "canary", CreationTimestamp: metav1.NewTime(convertT0)},
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
		o.Annotations = map[string]string{modelrewrite.StableTargetAnnotation: "llama-v1"}
		o.Spec.Rules = append(o.Spec.Rules, v1alpha2.InferenceModelRewriteRule{
			Targets: []v1alpha2.TargetModel{{ModelRewrite: "fallback"}},
		})
		o.Spec.Rules[0].Matches[0].Model.Type = &exactType
	})
	got, err := FromAPI(obj)
	if err != nil {
		t.Fatalf("FromAPI: %v", err)
	}
	if got.Key != (modelrewrite.ObjectKey{Namespace: "default", Name: "canary"}) || !got.Created.Equal(convertT0) || got.StableModel != "llama-v1" {
		t.Errorf("metadata: %+v", got)
	}
	if got.Pool != convertPool {
		t.Errorf("Pool = %+v, want %+v (defaults applied)", got.Pool, convertPool)
	}
	if len(got.Rules) != 2 || strings.Join(got.Rules[0].Models, ",") != "llama" || len(got.Rules[1].Models) != 0 ||
		got.Rules[0].Targets[1] != (modelrewrite.Target{Model: "llama-v2", Weight: 10}) || got.Rules[1].Targets[0] != (modelrewrite.Target{Model: "fallback"}) {
		t.Errorf("Rules = %+v", got.Rules)
	}
	obj.Spec.Rules[0].Matches[0].Model.Value = "changed"
	if got.Rules[0].Models[0] != "llama" {
		t.Error("the modelrewrite.Rewrite shares memory with the object")
	}
}

func TestValidate(t *testing.T) {
	other := v1alpha2.MatchValidationType("RegularExpression")
	servedPool := func(k modelrewrite.PoolKey) bool { return k == convertPool }
	tests := []struct {
		name       string
		obj        *v1alpha2.InferenceModelRewrite
		pools      func(modelrewrite.PoolKey) bool
		wantReason modelrewrite.Reason
		wantInMsg  string
	}{
		{name: "accepted", obj: apiRewrite(nil), pools: servedPool, wantReason: modelrewrite.ReasonAccepted},
		{
			name: "explicit default group and kind",
			obj: apiRewrite(func(o *v1alpha2.InferenceModelRewrite) {
				o.Spec.PoolRef.Group, o.Spec.PoolRef.Kind = modelrewrite.DefaultPoolGroup, modelrewrite.PoolKind
			}),
			pools:      servedPool,
			wantReason: modelrewrite.ReasonAccepted,
		},
		{
			name:  "unknown pool",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.PoolRef.Name = "elsewhere" }),
			pools: servedPool, wantReason: modelrewrite.ReasonPoolNotFound, wantInMsg: "elsewhere",
		},
		{
			name:  "pool of another group",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.PoolRef.Group = "inference.networking.x-k8s.io" }),
			pools: servedPool, wantReason: modelrewrite.ReasonPoolNotFound, wantInMsg: "x-k8s",
		},
		{name: "no convertPool lookup", obj: apiRewrite(nil), pools: nil, wantReason: modelrewrite.ReasonPoolNotFound},
		{
			name:  "missing poolRef",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.PoolRef = nil }),
			pools: servedPool, wantReason: modelrewrite.ReasonInvalidPoolRef, wantInMsg: "spec.poolRef",
		},
		{
			name:  "poolRef of another kind",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.PoolRef.Kind = "Service" }),
			pools: servedPool, wantReason: modelrewrite.ReasonInvalidPoolRef, wantInMsg: "Service",
		},
		{
			name:  "match without model",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.Rules[0].Matches[0].Model = nil }),
			pools: servedPool, wantReason: modelrewrite.ReasonInvalidMatch, wantInMsg: "spec.rules[0].matches[0].model",
		},
		{
			name:  "unsupported match type",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.Rules[0].Matches[0].Model.Type = &other }),
			pools: servedPool, wantReason: modelrewrite.ReasonInvalidMatch, wantInMsg: "RegularExpression",
		},
		{
			name:  "invalid weight",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.Rules[0].Targets[1].Weight = -3 }),
			pools: servedPool, wantReason: modelrewrite.ReasonInvalidWeight, wantInMsg: "spec.rules[0].targets[1].weight",
		},
		{
			name:  "mixed weights",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.Rules[0].Targets[1].Weight = 0 }),
			pools: servedPool, wantReason: modelrewrite.ReasonMixedWeights, wantInMsg: "spec.rules[0].targets",
		},
		{
			name:  "empty target",
			obj:   apiRewrite(func(o *v1alpha2.InferenceModelRewrite) { o.Spec.Rules[0].Targets[0].ModelRewrite = "" }),
			pools: servedPool, wantReason: modelrewrite.ReasonInvalidTarget, wantInMsg: "modelRewrite",
		},
		{
			name: "stable annotation names no target",
			obj: apiRewrite(func(o *v1alpha2.InferenceModelRewrite) {
				o.Annotations = map[string]string{modelrewrite.StableTargetAnnotation: "nope"}
			}),
			pools: servedPool, wantReason: modelrewrite.ReasonInvalidTarget, wantInMsg: "nope",
		},
		{name: "nil object", obj: nil, pools: servedPool, wantReason: modelrewrite.ReasonPending},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			accepted, reason, msg := Validate(tt.obj, tt.pools)
			if accepted != (tt.wantReason == modelrewrite.ReasonAccepted) || reason != tt.wantReason {
				t.Fatalf("Validate = (%v, %q, %q), want reason %q", accepted, reason, msg, tt.wantReason)
			}
			if msg == "" || !strings.Contains(msg, tt.wantInMsg) {
				t.Errorf("message %q does not mention %q", msg, tt.wantInMsg)
			}
		})
	}
}
