package conformance

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// fallbackConfig has upstream's max-score picker return three endpoints,
// the primary and two fallbacks (upstream plugin types only, so any EPP
// built on GIE loads it).
const fallbackConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
  parameters:
    maxNumOfEndpoints: 3
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
`

var fallbackGroup = Group{
	Name:    "Fallback",
	Fixture: &FixtureSpec{Pods: 3, Config: fallbackConfig},
	Cases: []Case{{
		Name: "FallbackList", Profile: EPPProfile,
		Ref:         Ref{Path: proposal004, Line: 71, Quote: "If retry is configured, the proxy will go sequentially down the list until one valid endpoint is found."},
		Requirement: "A picker configured for three endpoints names three distinct pool endpoints, primary first, identically in header and metadata.",
		Run: func(t *T, f *Fixture) {
			for range 5 {
				eps := f.route(t, Request{Body: Chat(uniquePrompt())})
				slices.Sort(eps)
				want := slices.Sorted(slices.Values(f.AllAddrs()))
				if !slices.Equal(eps, want) {
					t.Errorf("destination list %v, want the three endpoints %v", eps, want)
				}
			}
			t.Observe("endpoints-per-answer", "3")
		},
	}},
}

// Pool membership: which pods the EPP routes to follows the InferencePool
// selector and pod readiness, live.
var poolMembershipGroup = Group{
	Name:    "PoolMembership",
	Fixture: &FixtureSpec{Pods: 3},
	Cases: []Case{
		{
			Name: "NotReadyPodExcluded", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 75, Quote: "with 503 (Serivce Unavailable) HTTP status code if there are no ready endpoints"},
			Requirement: "A pod that turns NotReady stops receiving requests; Ready again, it receives them again.",
			Run: func(t *T, f *Fixture) {
				f.SetReady(t, f.Pods[1], false)
				f.eventuallyOnly(t, "a NotReady pod stops receiving requests", f.Addrs(0)[0], f.Addrs(2)[0])
				f.SetReady(t, f.Pods[1], true)
				f.WaitRoutesTo(t, f.Addrs(1)...)
				t.Observe("not-ready", "excluded")
			},
		},
		{
			Name: "SubsetOfNotReadyPod", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 40, Quote: "If none of the endpoints in the list is eligible"},
			Requirement: "A subset hint naming only a NotReady pod gets an immediate 503.",
			Run: func(t *T, f *Fixture) {
				f.SetReady(t, f.Pods[2], false)
				defer f.restoreReady(t, 2)
				eventuallyImmediate(t, f, Request{Subset: f.Addrs(2)}, 503)
			},
		},
		{
			Name: "LabelRemovedAndRestored", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 42, Quote: "then the EPP MUST select from the set defined by the `InferencePool` selector"},
			Requirement: "A pod whose labels stop matching the selector leaves the pool; matching again, it rejoins.",
			Run: func(t *T, f *Fixture) {
				setLabel(t, f, f.Pods[0], "app", "other")
				f.eventuallyOnly(t, "a pod that no longer matches the selector stops receiving requests", f.Addrs(1)[0], f.Addrs(2)[0])
				setLabel(t, f, f.Pods[0], "app", "model-server")
				f.WaitRoutesTo(t, f.Addrs(0)...)
				t.Observe("selector", "followed")
			},
		},
		{
			Name: "DeletedPodExcluded", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 42, Quote: "then the EPP MUST select from the set defined by the `InferencePool` selector"},
			Requirement: "A deleted pod stops receiving requests.",
			Run: func(t *T, f *Fixture) {
				if err := f.API.Client.Delete(context.Background(), f.Pods[2]); err != nil {
					t.Fatal(err)
				}
				f.eventuallyOnly(t, "a deleted pod stops receiving requests", f.Addrs(0)[0], f.Addrs(1)[0])
				t.Observe("deleted", "excluded")
			},
		},
		{
			Name: "NoReadyEndpoint", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 75, Quote: "with 503 (Serivce Unavailable) HTTP status code if there are no ready endpoints"},
			Requirement: "With no Ready pod in the pool, requests get an immediate 503.",
			Run: func(t *T, f *Fixture) {
				f.SetReady(t, f.Pods[0], false)
				f.SetReady(t, f.Pods[1], false)
				defer f.restoreReady(t, 0, 1)
				eventuallyImmediate(t, f, Request{}, 503)
			},
		},
		{
			Name: "PoolDeletedAndRecreated", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 42, Quote: "then the EPP MUST select from the set defined by the `InferencePool` selector"},
			Requirement: "While its InferencePool is deleted the EPP answers every request (it cannot route); recreated, it routes to the pool's pods again.",
			Run: func(t *T, f *Fixture) {
				pool := &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: f.Pool, Namespace: f.Namespace}}
				if err := f.API.Client.Get(context.Background(), client.ObjectKeyFromObject(pool), pool); err != nil {
					t.Fatal(err)
				}
				ports := pool.Spec.TargetPorts
				if err := f.API.Client.Delete(context.Background(), pool); err != nil {
					t.Fatal(err)
				}
				var during string
				runnertest.Eventually(t, "requests stop being routed once the pool is deleted", func() string {
					d, err := f.Envoy.Exchange(t.Context(), Request{Body: Chat(uniquePrompt())})
					switch {
					case err != nil:
						during = "stream error"
						return ""
					case d.Immediate != nil:
						during = fmt.Sprintf("immediate %d", d.Immediate.Status)
						return ""
					}
					return "still routed to " + d.Destination()
				})
				t.Observe("deleted-pool", "%s", during)
				if during == "stream error" {
					t.Errorf("with the pool deleted, a request broke its stream instead of getting an answer")
				}
				f.CreatePool(t, ports)
				f.WaitRoutesTo(t, f.Addrs(0)[0], f.Addrs(1)[0])
				t.Observe("recreated-pool", "routed")
			},
		},
	},
}

// Data-parallel ranks: every target port of a pod is an endpoint.
var dataParallelGroup = Group{
	Name:    "DataParallel",
	Fixture: &FixtureSpec{Pods: 2, Ranks: 3},
	Cases: []Case{
		{
			Name: "EveryTargetPortIsAnEndpoint", Profile: EPPProfile,
			Ref:         Ref{Path: "api/v1/inferencepool_types.go", Line: 73, Quote: "Every port will be treated as a distinctive endpoint by EPP"},
			Requirement: "With three targetPorts, requests reach each pod's three ip:port endpoints.",
			Run: func(t *T, f *Fixture) {
				seen := map[string]int{}
				for i := 0; i < 200 && len(seen) < len(f.AllAddrs()); i++ {
					for k, v := range f.routeCounts(t, 1, nil) {
						seen[k] += v
					}
				}
				onlyIn(t, seen, f.AllAddrs()...)
				if len(seen) != len(f.AllAddrs()) {
					t.Errorf("in 200 requests only %v were chosen, want all of %v", seen, f.AllAddrs())
				}
				t.Observe("ranks", "all-used")
			},
		},
		{
			Name: "SubsetHintNamesOneRank", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 35, Quote: `"x-gateway-destination-endpoint-subset": [<ip:port>, <ip:port>, ...]`},
			Requirement: "A subset hint naming one rank (ip:port) of a data-parallel pod gets that rank only, never a sibling rank on the same IP.",
			Run: func(t *T, f *Fixture) {
				for _, rank := range []string{f.Addrs(1)[0], f.Addrs(1)[2]} {
					onlyIn(t, f.routeCounts(t, 10, []string{rank}), rank)
				}
				t.Observe("subset", "per-rank")
			},
		},
	},
}

// eventuallyOnly waits until a batch of twelve requests is routed, only to
// allowed (an immediate response while the EPP takes the change in is
// retried, as a misroute is).
func (f *Fixture) eventuallyOnly(t *T, what string, allowed ...string) {
	t.Helper()
	runnertest.Eventually(t, what, func() string {
		for range 12 {
			d := f.exchange(t, Request{Body: Chat(uniquePrompt())})
			if d.Immediate != nil {
				return fmt.Sprintf("immediate response %d: %s", d.Immediate.Status, d.Immediate.Body)
			}
			if ep := splitEndpoints(d.Destination())[0]; !slices.Contains(allowed, ep) {
				return "still routed to " + ep
			}
		}
		return ""
	})
}

// eventuallyImmediate waits until req (a fresh chat request when its body
// is empty) gets an immediate response, gives the EPP a second to settle
// (its parts may learn of a change one after the other), and requires the
// answer to the next such request to be an immediate response with one of
// statuses, which it observes.
func eventuallyImmediate(t *T, f *Fixture, req Request, statuses ...int) {
	t.Helper()
	fresh := func() Request {
		r := req
		if r.Body == nil && r.Method == "" {
			r.Body = Chat(uniquePrompt())
		}
		return r
	}
	runnertest.Eventually(t, fmt.Sprintf("requests get an immediate %v", statuses), func() string {
		if d := f.exchange(t, fresh()); d.Immediate == nil {
			return "still routed to " + d.Destination()
		}
		return ""
	})
	time.Sleep(time.Second)
	d, err := f.Envoy.Exchange(t.Context(), fresh())
	switch {
	case err != nil:
		t.Fatalf("ext_proc exchange: %v", err)
	case d.Immediate == nil:
		t.Fatalf("routed to %s again without a change to the pool", d.Destination())
	}
	observeImmediate(t, d.Immediate)
	if !slices.Contains(statuses, d.Immediate.Status) {
		t.Errorf("immediate response %d, want %v: %s", d.Immediate.Status, statuses, d.Immediate.Body)
	}
}

// restoreReady makes pods Ready again and waits until they are routed to.
func (f *Fixture) restoreReady(t *T, pods ...int) {
	t.Helper()
	var addrs []string
	for _, i := range pods {
		f.SetReady(t, f.Pods[i], true)
		addrs = append(addrs, f.Addrs(i)...)
	}
	f.WaitRoutesTo(t, addrs...)
}

func setLabel(t *T, f *Fixture, pod *corev1.Pod, key, value string) {
	t.Helper()
	Update(t, f.API.Client, pod, func(p *corev1.Pod) { p.Labels[key] = value })
}
