package conformance

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// moderateLoad saturates a pool for upstream's detector (5 waiting: its
// queue threshold) without being past every implementation's limit for
// Standard requests (Sluice's burst tier takes Standard up to 16 waiting):
// it is where a request's priority, and only its priority, decides between
// routing and shedding.
var moderateLoad = Load{Waiting: 5, Running: 4, KV: 0.1}

var objectivesGroup = Group{
	Name:    "InferenceObjectives",
	Fixture: &FixtureSpec{Pods: 2},
	Cases: []Case{
		{
			Name: "SheddableRejectedUnderLoad", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 76, Quote: "with 429 (Too Many Requests) HTTP status code if the request should be dropped"},
			Requirement: "On a saturated pool, a request of a negative-priority (Sheddable) InferenceObjective gets an immediate 429.",
			Run: func(t *T, f *Fixture) {
				f.ReportAll(VLLM, moderateLoad)
				createObjective(t, f, "conf-sheddable", -1)
				eventuallyImmediate(t, f, Request{Body: Chat(uniquePrompt()), Headers: objectiveHeader("conf-sheddable")}, 429)
			},
		},
		{
			Name: "StandardRoutedUnderLoad", Profile: EPPProfile,
			Ref:         Ref{Path: "apix/v1alpha2/inferenceobjective_types.go", Line: 64, Quote: "will treat an unset value as '0'"},
			Requirement: "On the same pool, a request without an objective (priority 0) is routed.",
			Run: func(t *T, f *Fixture) {
				f.ReportAll(VLLM, moderateLoad)
				f.routeCounts(t, 5, nil)
				t.Observe("standard", "routed")
			},
		},
		{
			Name: "PriorityChangedLive", Profile: EPPProfile,
			Ref:         Ref{Path: "apix/v1alpha2/inferenceobjective_types.go", Line: 62, Quote: "The higher the value, the more critical the request is; negative values _are_ allowed."},
			Requirement: "Changing an InferenceObjective's priority applies to the next requests without a restart: -1 is shed, 0 is routed, -1 is shed again.",
			Run: func(t *T, f *Fixture) {
				f.ReportAll(VLLM, moderateLoad)
				obj := createObjective(t, f, "conf-live", -1)
				req := func() Request { return Request{Body: Chat(uniquePrompt()), Headers: objectiveHeader("conf-live")} }
				eventuallyImmediate(t, f, req(), 429)
				setPriority(t, f, obj, 0)
				runnertest.Eventually(t, "priority 0 is routed", func() string {
					if d := f.exchange(t, req()); d.Immediate != nil {
						return fmt.Sprintf("immediate %d", d.Immediate.Status)
					}
					return ""
				})
				setPriority(t, f, obj, -1)
				eventuallyImmediate(t, f, req(), 429)
				t.Observe("live", "applied")
			},
		},
	},
}

func objectiveHeader(name string) map[string]string {
	return map[string]string{metadata.ObjectiveKey: name}
}

func createObjective(t *T, f *Fixture, name string, priority int) *v1alpha2.InferenceObjective {
	t.Helper()
	obj := &v1alpha2.InferenceObjective{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.Namespace},
		Spec: v1alpha2.InferenceObjectiveSpec{
			Priority: &priority,
			PoolRef:  v1alpha2.PoolObjectReference{Group: "inference.networking.k8s.io", Kind: "InferencePool", Name: v1alpha2.ObjectName(f.Pool)},
		},
	}
	f.create(t, obj)
	return obj
}

func setPriority(t *T, f *Fixture, obj *v1alpha2.InferenceObjective, priority int) {
	t.Helper()
	Update(t, f.API.Client, obj, func(o *v1alpha2.InferenceObjective) { o.Spec.Priority = &priority })
}

// InferenceModelRewrite rules applied live, on an idle pool.
var modelRewritesGroup = Group{
	Name:    "ModelRewrites",
	Fixture: &FixtureSpec{Pods: 2},
	Cases: []Case{{
		Name: "RewriteAppliedLive", Profile: EPPProfile,
		Ref:         Ref{Path: proposal1816, Line: 111, Quote: "Weight defines the proportion of requests forwarded to the specified"},
		Requirement: "A rewrite with one target forwards every matching request with the target model and answers the client with the model it asked for; changes and deletion apply live.",
		Run: func(t *T, f *Fixture) {
			const alias = "conf-alias"
			rw := &v1alpha2.InferenceModelRewrite{
				ObjectMeta: metav1.ObjectMeta{Name: "conf-rewrite", Namespace: f.Namespace},
				Spec: v1alpha2.InferenceModelRewriteSpec{
					PoolRef: &v1alpha2.PoolObjectReference{Group: "inference.networking.k8s.io", Kind: "InferencePool", Name: v1alpha2.ObjectName(f.Pool)},
					Rules: []v1alpha2.InferenceModelRewriteRule{{
						Matches: []v1alpha2.Match{{Model: &v1alpha2.ModelMatch{Value: alias}}},
						Targets: []v1alpha2.TargetModel{{ModelRewrite: "conf-target-a", Weight: 100}},
					}},
				},
			}
			f.create(t, rw)
			f.eventuallyForwardedAs(t, alias, "conf-target-a")
			Update(t, f.API.Client, rw, func(r *v1alpha2.InferenceModelRewrite) {
				r.Spec.Rules[0].Targets[0].ModelRewrite = "conf-target-b"
			})
			f.eventuallyForwardedAs(t, alias, "conf-target-b")
			if err := f.API.Client.Delete(context.Background(), rw); err != nil {
				t.Fatal(err)
			}
			f.eventuallyForwardedAs(t, alias, alias)
			t.Observe("rewrite", "live")
		},
	}},
}

// eventuallyForwardedAs waits until a request for model is forwarded with
// want, then checks the client sees model in the answer.
func (f *Fixture) eventuallyForwardedAs(t *T, model, want string) {
	t.Helper()
	runnertest.Eventually(t, fmt.Sprintf("requests for %s are forwarded as %s", model, want), func() string {
		d := f.exchange(t, Request{Body: ChatFor(model, uniquePrompt(), false), Response: ChatCompletionReply(want)})
		if d.Immediate != nil {
			return fmt.Sprintf("immediate %d: %s", d.Immediate.Status, d.Immediate.Body)
		}
		var fwd, resp struct {
			Model string `json:"model"`
		}
		if err := json.Unmarshal(d.Body, &fwd); err != nil {
			return fmt.Sprintf("forwarded body %q: %v", d.Body, err)
		}
		if fwd.Model != want {
			return fmt.Sprintf("forwarded as %q", fwd.Model)
		}
		if err := json.Unmarshal(d.ResponseBody, &resp); err != nil || resp.Model != model {
			t.Errorf("forwarded as %s, the client's answer names %q, want %q", want, resp.Model, model)
		}
		return ""
	})
}
