package rewritecontroller

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/sluice-gw/sluice/modelrewrite"
)

var (
	pool = modelrewrite.PoolKey{Namespace: "default", Group: modelrewrite.DefaultPoolGroup, Name: "vllm"}
	t0   = time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
)

// imr builds an object of pool with one rule for "llama" split over targets.
func imr(name string, gen int64, created time.Time, targets ...v1alpha2.TargetModel) v1alpha2.InferenceModelRewrite {
	return v1alpha2.InferenceModelRewrite{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Generation: gen, CreationTimestamp: metav1.NewTime(created)},
		Spec: v1alpha2.InferenceModelRewriteSpec{
			PoolRef: &v1alpha2.PoolObjectReference{Name: "vllm"},
			Rules: []v1alpha2.InferenceModelRewriteRule{{
				Matches: []v1alpha2.Match{{Model: &v1alpha2.ModelMatch{Value: "llama"}}},
				Targets: targets,
			}},
		},
	}
}

func target(model string, weight int32) v1alpha2.TargetModel {
	return v1alpha2.TargetModel{ModelRewrite: model, Weight: weight}
}

func conditionOf(t *testing.T, vs []verdict, name, typ string) *metav1.Condition {
	t.Helper()
	for _, v := range vs {
		if v.obj.Name == name {
			return meta.FindStatusCondition(v.conditions, typ)
		}
	}
	t.Fatalf("no verdict for %s", name)
	return nil
}

func TestDecideAcceptedCondition(t *testing.T) {
	otherPool := imr("other-pool", 1, t0, target("x", 1))
	otherPool.Spec.PoolRef.Name = "elsewhere"
	otherGroup := imr("other-group", 1, t0, target("x", 1))
	otherGroup.Spec.PoolRef.Group = "inference.networking.x-k8s.io"
	deleted := imr("deleted", 1, t0, target("x", 1))
	deleted.DeletionTimestamp = &metav1.Time{Time: t0}
	badKind := imr("bad-kind", 4, t0, target("x", 1))
	badKind.Spec.PoolRef.Kind = "Service"
	objs := []v1alpha2.InferenceModelRewrite{
		imr("canary", 3, t0, target("llama-v1", 90), target("llama-v2", 10)),
		imr("mixed", 2, t0, target("llama-v1", 90), target("llama-v2", 0)),
		imr("too-heavy", 1, t0, target("llama-v1", modelrewrite.MaxWeight+1)),
		badKind, otherPool, otherGroup, deleted,
	}
	tests := []struct {
		name, reason string
		status       metav1.ConditionStatus
		generation   int64
		field        string
	}{
		{"canary", "Accepted", metav1.ConditionTrue, 3, ""},
		{"mixed", "MixedWeights", metav1.ConditionFalse, 2, "spec.rules[0].targets"},
		{"too-heavy", "InvalidWeight", metav1.ConditionFalse, 1, "spec.rules[0].targets[0].weight"},
		{"bad-kind", "InvalidPoolRef", metav1.ConditionFalse, 4, "spec.poolRef.kind"},
	}
	table, verdicts, err := decide(pool, objs, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(verdicts) != len(tests) {
		t.Fatalf("%d verdicts, want %d (other pools' and deleted objects are not ours)", len(verdicts), len(tests))
	}
	for _, tt := range tests {
		c := conditionOf(t, verdicts, tt.name, ConditionAccepted)
		if c == nil || c.Status != tt.status || c.Reason != tt.reason || c.ObservedGeneration != tt.generation || !strings.Contains(c.Message, tt.field) {
			t.Errorf("%s: condition %+v, want %s/%s at generation %d naming %q", tt.name, c, tt.status, tt.reason, tt.generation, tt.field)
		}
		if g := conditionOf(t, verdicts, tt.name, ConditionGuardrailTripped); g != nil {
			t.Errorf("%s: unexpected %+v without trips", tt.name, g)
		}
	}
	d := table.Decide(modelrewrite.Request{Pool: pool, Model: "llama", SessionKey: "s"}, nil, nil)
	if d.Kind != modelrewrite.KindSticky || d.Rule.Object.Name != "canary" {
		t.Fatalf("decision %+v, want the accepted object's rule", d)
	}
}

func TestDecidePoolNotFound(t *testing.T) {
	table, verdicts, err := decide(pool, []v1alpha2.InferenceModelRewrite{imr("canary", 1, t0, target("llama-v2", 1))}, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := conditionOf(t, verdicts, "canary", ConditionAccepted); c.Status != metav1.ConditionFalse || c.Reason != string(modelrewrite.ReasonPoolNotFound) {
		t.Fatalf("condition %+v, want False/PoolNotFound", c)
	}
	if d := table.Decide(modelrewrite.Request{Pool: pool, Model: "llama"}, nil, nil); d.Kind != modelrewrite.KindNoMatch {
		t.Fatalf("decision %+v: a rejected object must not keep effect", d)
	}
}

func TestDecideGuardrailCondition(t *testing.T) {
	rule := modelrewrite.RuleID{Object: modelrewrite.ObjectKey{Namespace: "default", Name: "canary"}}
	trip := modelrewrite.Trip{Rule: rule, Target: "llama-v2", Stable: "llama-v1", Since: t0,
		TargetErrorRatio: 0.3, StableErrorRatio: 0.01, TargetRequests: 40, StableRequests: 400}
	canary := imr("canary", 5, t0, target("llama-v1", 90), target("llama-v2", 10))

	_, verdicts, err := decide(pool, []v1alpha2.InferenceModelRewrite{canary}, true, []modelrewrite.Trip{trip})
	if err != nil {
		t.Fatal(err)
	}
	c := conditionOf(t, verdicts, "canary", ConditionGuardrailTripped)
	for _, want := range []string{`"llama-v2"`, "0.300", "0.010", `"llama-v1"`, modelrewrite.ClearGuardrailAnnotation, "kubectl annotate -n default inferencemodelrewrite canary"} {
		if c == nil || !strings.Contains(c.Message, want) {
			t.Fatalf("condition %+v, want a message naming %s", c, want)
		}
	}
	if c.Status != metav1.ConditionTrue || c.Reason != ReasonErrorRatioExceeded || c.ObservedGeneration != 5 {
		t.Fatalf("condition %+v, want True/%s at generation 5", c, ReasonErrorRatioExceeded)
	}

	// Cleared: the object that carried the condition reads False.
	canary.Status.Conditions = []metav1.Condition{*c}
	_, verdicts, err = decide(pool, []v1alpha2.InferenceModelRewrite{canary}, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := conditionOf(t, verdicts, "canary", ConditionGuardrailTripped); c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonNoTargetDiverted {
		t.Fatalf("after the clear: %+v, want False/%s", c, ReasonNoTargetDiverted)
	}
}
