package rewritecontroller

import (
	"encoding/json"
	"slices"
	"testing"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/sluice-gw/sluice/modelrewrite"
)

// FuzzDecideRewrites runs arbitrary InferenceModelRewrite objects (a JSON list, as the API server could hold them)
// through the reconciler's decision: validation, precedence and the table of rules in force. Whatever they say, the
// decision reports no internal error; every object of the pool gets one Accepted condition with a reason from the
// closed set and a message the API server stores; the table exists exactly when some object is accepted; and a
// request for any model an accepted rule matches is sent with a target of an accepted rule that matches it, never
// with a model no accepted rule names. Seeds are in testdata/fuzz/FuzzDecideRewrites.
func FuzzDecideRewrites(f *testing.F) {
	pool := modelrewrite.PoolKey{Namespace: "ns", Group: modelrewrite.DefaultPoolGroup, Name: "pool"}
	reasons := map[string]bool{}
	for _, r := range []modelrewrite.Reason{modelrewrite.ReasonAccepted, modelrewrite.ReasonPoolNotFound, modelrewrite.ReasonInvalidPoolRef,
		modelrewrite.ReasonInvalidMatch, modelrewrite.ReasonInvalidTarget, modelrewrite.ReasonInvalidWeight, modelrewrite.ReasonMixedWeights} {
		reasons[string(r)] = true
	}
	f.Fuzz(func(t *testing.T, raw []byte, poolFound bool, session string) {
		var objs []v1alpha2.InferenceModelRewrite
		if json.Unmarshal(raw, &objs) != nil {
			return
		}
		table, verdicts, err := decide(pool, objs, poolFound, nil)
		if err != nil {
			t.Fatalf("decide: %v", err)
		}
		owned := 0
		for i := range objs {
			if objs[i].DeletionTimestamp == nil && owns(pool, &objs[i]) {
				owned++
			}
		}
		if len(verdicts) != owned {
			t.Fatalf("%d verdicts for %d objects of the pool", len(verdicts), owned)
		}
		// targets maps each model an accepted rule matches ("" for a generic rule) to the targets it may be sent with.
		targets := map[string][]string{}
		for _, v := range verdicts {
			c := v.conditions[0]
			if c.Type != ConditionAccepted || !reasons[c.Reason] || (c.Status == metav1.ConditionTrue) != (c.Reason == string(modelrewrite.ReasonAccepted)) {
				t.Fatalf("%s: condition %+v", v.obj.Name, c)
			}
			if len(c.Message) > maxMessageLen || !utf8.ValidString(c.Message) {
				t.Fatalf("%s: message of %d bytes cannot be stored", v.obj.Name, len(c.Message))
			}
			if c.Status != metav1.ConditionTrue {
				continue
			}
			for _, rule := range v.obj.Spec.Rules {
				var names []string
				for _, tg := range rule.Targets {
					names = append(names, tg.ModelRewrite)
				}
				if len(rule.Matches) == 0 {
					targets[""] = append(targets[""], names...)
				}
				for _, m := range rule.Matches {
					targets[m.Model.Value] = append(targets[m.Model.Value], names...)
				}
			}
		}
		if (table != nil) != anyAccepted(verdicts) {
			t.Fatalf("a table (%v) must exist exactly when some object is accepted", table != nil)
		}
		if table == nil {
			return
		}
		for model := range targets {
			if model == "" {
				continue
			}
			d := table.Decide(modelrewrite.Request{Pool: pool, Model: model, SessionKey: session}, nil, nil)
			if d.Rewritten() && !slices.Contains(targets[model], d.Model) && !slices.Contains(targets[""], d.Model) {
				t.Fatalf("model %q sent as %q, which no accepted rule for it targets (%v)", model, d.Model, targets[model])
			}
		}
	})
}

func anyAccepted(verdicts []verdict) bool {
	for _, v := range verdicts {
		if v.conditions[0].Status == metav1.ConditionTrue {
			return true
		}
	}
	return false
}
