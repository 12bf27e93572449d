package modelrewrite

import (
	"errors"
	"strings"
	"testing"
)

func TestRewriteValidate(t *testing.T) {
	tests := []struct {
		name       string
		rw         Rewrite
		wantReason Reason // "" means valid
		wantField  string
	}{
		{name: "generic unweighted", rw: rewrite("a", t0, generic("m1", "m2"))},
		{name: "weighted", rw: rewrite("a", t0, weighted([]string{"m"}, Target{"m1", 90}, Target{"m2", 10}))},
		{name: "max weight", rw: rewrite("a", t0, weighted(nil, Target{"m1", MaxWeight}))},
		{name: "no rules", rw: rewrite("a", t0)},
		{name: "rule without targets", rw: rewrite("a", t0, exact([]string{"m"}))},
		{
			name:       "empty pool name",
			rw:         Rewrite{Key: ObjectKey{"ns", "a"}, Pool: PoolKey{Namespace: "ns", Group: DefaultPoolGroup}},
			wantReason: ReasonInvalidPoolRef, wantField: "spec.poolRef.name",
		},
		{
			name:       "empty match value",
			rw:         rewrite("a", t0, generic("x"), exact([]string{"m", ""}, "t")),
			wantReason: ReasonInvalidMatch, wantField: "spec.rules[1].matches[1].model.value",
		},
		{
			name:       "empty target model",
			rw:         rewrite("a", t0, exact([]string{"m"}, "t", "")),
			wantReason: ReasonInvalidTarget, wantField: "spec.rules[0].targets[1].modelRewrite",
		},
		{
			name:       "negative weight",
			rw:         rewrite("a", t0, weighted(nil, Target{"m1", -1}, Target{"m2", 1})),
			wantReason: ReasonInvalidWeight, wantField: "spec.rules[0].targets[0].weight",
		},
		{
			name:       "weight above max",
			rw:         rewrite("a", t0, weighted(nil, Target{"m1", MaxWeight + 1})),
			wantReason: ReasonInvalidWeight, wantField: "spec.rules[0].targets[0].weight",
		},
		{
			name:       "mixed weighted and unweighted",
			rw:         rewrite("a", t0, weighted(nil, Target{"m1", 5}, Target{"m2", 0})),
			wantReason: ReasonMixedWeights, wantField: "spec.rules[0].targets",
		},
		{
			name: "stable target listed",
			rw: func() Rewrite {
				rw := rewrite("a", t0, weighted(nil, Target{"m1", 5}, Target{"m2", 50}))
				rw.StableModel = "m1"
				return rw
			}(),
		},
		{
			name: "stable target not a target",
			rw: func() Rewrite {
				rw := rewrite("a", t0, weighted(nil, Target{"m1", 5}, Target{"m2", 50}))
				rw.StableModel = "m3"
				return rw
			}(),
			wantReason: ReasonInvalidTarget, wantField: "metadata.annotations[" + StableTargetAnnotation + "]",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.rw.Validate()
			if tt.wantReason == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Validate() = %v, want a *ValidationError", err)
			}
			if ve.Reason != tt.wantReason || ve.Field != tt.wantField {
				t.Errorf("Validate() reason %q field %q, want %q %q", ve.Reason, ve.Field, tt.wantReason, tt.wantField)
			}
			if ve.Object != tt.rw.Key || !strings.Contains(err.Error(), tt.rw.Key.String()) {
				t.Errorf("error %q does not name object %s", err, tt.rw.Key)
			}
		})
	}
}
