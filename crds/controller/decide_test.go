package controller

import (
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sluice-gw/sluice/crds"
	"github.com/sluice-gw/sluice/flowcontrol"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func policy(name string, created time.Duration, ref crds.PoolReference, mutate ...func(*crds.FlowControlPolicySpec)) crds.FlowControlPolicy {
	p := crds.FlowControlPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Generation: 3, CreationTimestamp: metav1.NewTime(t0.Add(created))},
		Spec:       crds.FlowControlPolicySpec{PoolRef: ref},
	}
	for _, m := range mutate {
		m(&p.Spec)
	}
	return p
}

func queued(n int64) func(*crds.FlowControlPolicySpec) {
	return func(s *crds.FlowControlPolicySpec) { s.MaxQueuedRequests = ptr.To(n) }
}

func configWithQueued(n int64) *flowcontrol.Config {
	cfg := flowcontrol.DefaultConfig()
	cfg.MaxQueuedRequests = n
	return cfg
}

func TestDecide(t *testing.T) {
	pool := Pool{Namespace: "ns", Name: "pool"}
	ref := crds.PoolReference{Group: DefaultPoolGroup, Kind: "InferencePool", Name: "pool"}
	invalid := func(s *crds.FlowControlPolicySpec) {
		s.Bands = &crds.Bands{Critical: &crds.CriticalBand{SaturationCeiling: ptr.To(0.5)}}
	}
	deleting := policy("deleting", -time.Hour, ref, queued(1))
	deleting.DeletionTimestamp = ptr.To(metav1.NewTime(t0))

	type want struct{ name, status, reason, message string }
	for _, tc := range []struct {
		name      string
		pool      Pool
		policies  []crds.FlowControlPolicy
		poolFound bool
		inForce   *flowcontrol.Config
		verdicts  []want
	}{
		{name: "no policy", pool: pool, poolFound: true, inForce: flowcontrol.DefaultConfig()},
		{name: "accepted", pool: pool, poolFound: true,
			policies: []crds.FlowControlPolicy{policy("a", 0, ref, queued(7))},
			inForce:  configWithQueued(7),
			verdicts: []want{{"a", "True", crds.ReasonAccepted, "in force for InferencePool ns/pool"}}},
		{name: "defaults of an unset group and kind", pool: pool, poolFound: true,
			policies: []crds.FlowControlPolicy{policy("a", 0, crds.PoolReference{Name: "pool"}, queued(7))},
			inForce:  configWithQueued(7),
			verdicts: []want{{"a", "True", crds.ReasonAccepted, ""}}},
		{name: "pool not found", pool: pool,
			policies: []crds.FlowControlPolicy{policy("a", 0, ref, queued(7)), policy("b", time.Second, ref, invalid)},
			inForce:  flowcontrol.DefaultConfig(),
			verdicts: []want{
				{"a", "False", crds.ReasonPoolNotFound, "InferencePool ns/pool not found"},
				{"b", "False", crds.ReasonPoolNotFound, "InferencePool ns/pool not found"},
			}},
		{name: "invalid spec never wins", pool: pool, poolFound: true,
			policies: []crds.FlowControlPolicy{policy("new", time.Minute, ref, queued(9)), policy("old", 0, ref, invalid)},
			inForce:  configWithQueued(9),
			verdicts: []want{
				{"old", "False", crds.ReasonInvalidSpec, "inverted ceilings: bands.standard.saturationCeiling (0.8) exceeds bands.critical.saturationCeiling (0.5)"},
				{"new", "True", crds.ReasonAccepted, ""},
			}},
		{name: "only invalid: defaults in force", pool: pool, poolFound: true,
			policies: []crds.FlowControlPolicy{policy("old", 0, ref, invalid)},
			inForce:  flowcontrol.DefaultConfig(),
			verdicts: []want{{"old", "False", crds.ReasonInvalidSpec, "invalid flow control configuration"}}},
		{name: "oldest wins, then name", pool: pool, poolFound: true,
			policies: []crds.FlowControlPolicy{
				policy("c", time.Second, ref, queued(3)), policy("b", 0, ref, queued(2)), policy("a", time.Second, ref, queued(1)),
			},
			inForce: configWithQueued(2),
			verdicts: []want{
				{"b", "True", crds.ReasonAccepted, ""},
				{"a", "False", crds.ReasonConflicted, "FlowControlPolicy b is older and in force for InferencePool ns/pool"},
				{"c", "False", crds.ReasonConflicted, "FlowControlPolicy b is older"},
			}},
		{name: "other pools and deleting policies are not ours", pool: pool, poolFound: true,
			policies: []crds.FlowControlPolicy{
				policy("other-name", -time.Hour, crds.PoolReference{Name: "other"}, queued(1)),
				policy("other-group", -time.Hour, crds.PoolReference{Group: "inference.networking.x-k8s.io", Name: "pool"}, queued(1)),
				deleting,
				policy("mine", 0, ref, queued(5)),
			},
			inForce:  configWithQueued(5),
			verdicts: []want{{"mine", "True", crds.ReasonAccepted, ""}}},
		{name: "pool in another group", pool: Pool{Group: "inference.networking.x-k8s.io", Namespace: "ns", Name: "pool"}, poolFound: true,
			policies: []crds.FlowControlPolicy{
				policy("v1", -time.Hour, ref, queued(1)),
				policy("alpha", 0, crds.PoolReference{Group: "inference.networking.x-k8s.io", Name: "pool"}, queued(2)),
			},
			inForce:  configWithQueued(2),
			verdicts: []want{{"alpha", "True", crds.ReasonAccepted, ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before []crds.FlowControlPolicy
			for _, p := range tc.policies {
				before = append(before, *p.DeepCopy())
			}
			inForce, verdicts := decide(tc.pool, tc.policies, tc.poolFound)
			if !reflect.DeepEqual(inForce, tc.inForce) {
				t.Errorf("in force:\n got %+v\nwant %+v", inForce, tc.inForce)
			}
			if len(verdicts) != len(tc.verdicts) {
				t.Fatalf("%d verdicts, want %d: %+v", len(verdicts), len(tc.verdicts), verdicts)
			}
			for i, w := range tc.verdicts {
				v := verdicts[i]
				c := v.condition
				if v.policy.Name != w.name || string(c.Status) != w.status || c.Reason != w.reason ||
					!strings.Contains(c.Message, w.message) || c.Type != crds.ConditionAccepted || c.ObservedGeneration != 3 {
					t.Errorf("verdict %d: %s %+v, want %+v", i, v.policy.Name, c, w)
				}
			}
			if !reflect.DeepEqual(tc.policies, before) {
				t.Error("decide modified its input")
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"0123456789abc", 10, "0123456..."},
		{"ab€€€", 8, "ab€..."}, // cut at byte 5, between two €
		{"ab€€€", 9, "ab€..."}, // cut at byte 6 would split the second €
	} {
		if got := truncate(tc.in, tc.n); got != tc.want || len(got) > tc.n {
			t.Errorf("truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}
