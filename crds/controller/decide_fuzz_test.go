package controller

import (
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-gw/sluice/crds"
	"github.com/sluice-gw/sluice/flowcontrol"
)

// FuzzDecidePolicies runs arbitrary FlowControlPolicy objects (a JSON list, as the API server could hold them,
// including objects stored before a schema rule existed) through the reconciler's decision. Whatever they say: the
// configuration put in force validates; every policy of the pool gets exactly one Accepted condition, with a reason
// from the closed set and a message the API server stores (valid UTF-8, within metav1.Condition's limit); at most one
// is accepted, none without the pool, and the accepted one is exactly what is in force; with none accepted the
// defaults are. Seeds are in testdata/fuzz/FuzzDecidePolicies.
func FuzzDecidePolicies(f *testing.F) {
	pool := Pool{Namespace: "ns", Name: "pool"}
	reasons := map[string]bool{crds.ReasonAccepted: true, crds.ReasonInvalidSpec: true, crds.ReasonPoolNotFound: true, crds.ReasonConflicted: true}
	f.Fuzz(func(t *testing.T, raw []byte, poolFound bool) {
		var policies []crds.FlowControlPolicy
		if json.Unmarshal(raw, &policies) != nil {
			return
		}
		inForce, verdicts := decide(pool, policies, poolFound)
		if err := inForce.Validate(); err != nil {
			t.Fatalf("the configuration in force does not validate: %v", err)
		}
		owned := 0
		for i := range policies {
			if policies[i].DeletionTimestamp == nil && pool.references(policies[i].Spec.PoolRef) {
				owned++
			}
		}
		if len(verdicts) != owned {
			t.Fatalf("%d verdicts for %d policies of the pool", len(verdicts), owned)
		}
		accepted := 0
		for _, v := range verdicts {
			c := v.condition
			if c.Type != crds.ConditionAccepted || !reasons[c.Reason] || (c.Status == metav1.ConditionTrue) != (c.Reason == crds.ReasonAccepted) {
				t.Fatalf("policy %s: condition %+v", v.policy.Name, c)
			}
			if len(c.Message) > maxMessageLen || !utf8.ValidString(c.Message) || c.Message == "" {
				t.Fatalf("policy %s: message of %d bytes (valid UTF-8: %v) cannot be stored", v.policy.Name, len(c.Message), utf8.ValidString(c.Message))
			}
			if c.Status != metav1.ConditionTrue {
				continue
			}
			accepted++
			cfg, err := v.policy.Spec.ToConfig()
			if err != nil || !reflect.DeepEqual(cfg, inForce) {
				t.Fatalf("accepted policy %s is not what is in force (%v)", v.policy.Name, err)
			}
		}
		if accepted > 1 || (!poolFound && accepted > 0) {
			t.Fatalf("%d policies accepted (pool found: %v)", accepted, poolFound)
		}
		if accepted == 0 && !reflect.DeepEqual(inForce, flowcontrol.DefaultConfig()) {
			t.Fatalf("no policy accepted, yet the configuration in force is not the default")
		}
	})
}
