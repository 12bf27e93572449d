package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-gw/sluice/crds"
	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/runner/runnertest"
)

// TestFlowControlPolicyLive runs the EPP binary in Kubernetes mode with Sluice admission and shows a
// FlowControlPolicy taking effect without a restart: a tenant routed under the defaults is capped to Sheddable and
// shed (429, saturated) once the policy is accepted, and routed again once it is deleted.
func TestFlowControlPolicyLive(t *testing.T) {
	api := runnertest.StartAPIServer(t, []string{filepath.Join("..", "..", "crds", "manifests")}, crds.AddToScheme)
	c := api.Client
	ctx := context.Background()
	port := runnertest.FreePort(t)
	server := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.2:%d", port))
	// Saturation 1/2 = 0.5 (one waiting over the default queue-depth threshold of 2): headroom for every band under
	// the defaults (Sheddable's ceiling is 0.6), none for a Sheddable ceiling of 0.2.
	server.Waiting.Store(1)
	api.CreatePool(t, port)
	api.CreateReadyPod(t, "vllm-a", "127.0.0.2")

	epp := runnertest.StartEPP(t, []string{"KUBECONFIG=" + api.Kubeconfig, "NAMESPACE=default"},
		"--pool-name=vllm", "--secure-serving=false", "--sluice-admission")
	batch := map[string]string{"x-gateway-inference-fairness-id": "batch"}
	other := map[string]string{"x-gateway-inference-fairness-id": "other"}
	var prompt int
	route := func(headers map[string]string) runnertest.Answer {
		prompt++
		body := map[string]any{"model": "base", "prompt": fmt.Sprintf("prompt %d", prompt), "max_tokens": 16}
		return runnertest.Route(t, epp.GRPCPort, false, headers, body, nil)
	}
	routed := func(headers map[string]string) func() string {
		return func() string {
			if a := route(headers); a.Destination != server.Addr {
				return fmt.Sprintf("answer %+v, want routed to %s", a, server.Addr)
			}
			return ""
		}
	}
	runnertest.Eventually(t, "without a policy, the batch tenant is routed", routed(batch))

	policy := &crds.FlowControlPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "batch-sheddable", Namespace: "default"},
		Spec: crds.FlowControlPolicySpec{
			PoolRef: crds.PoolReference{Name: "vllm"},
			Bands:   &crds.Bands{Sheddable: &crds.SheddableBand{SaturationCeiling: ptr.To(0.2)}},
			Tenants: []crds.TenantPolicy{{Name: "batch", MaxBand: ptr.To("Sheddable")}},
			// Scrapes on a busy test machine can lag behind the 200ms default.
			Endpoint: &crds.EndpointThresholds{MetricsStalenessThreshold: &metav1.Duration{Duration: 3 * time.Second}},
		},
	}
	if err := c.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	runnertest.Eventually(t, "the policy is accepted", func() string {
		var got crds.FlowControlPolicy
		if err := c.Get(ctx, client.ObjectKeyFromObject(policy), &got); err != nil {
			return err.Error()
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, crds.ConditionAccepted) {
			return fmt.Sprintf("conditions %+v", got.Status.Conditions)
		}
		return ""
	})

	var shed runnertest.Answer
	runnertest.Eventually(t, "the accepted policy sheds the capped tenant", func() string {
		if shed = route(batch); shed.Status == 0 {
			return fmt.Sprintf("still routed (%+v): the policy is not in force yet", shed)
		}
		return ""
	})
	if shed.Status != 429 || shed.Headers[plugins.ShedReasonHeader] != "saturated" || shed.Headers["retry-after"] == "" {
		t.Fatalf("batch answer %+v, want 429 with %s: saturated and a Retry-After", shed, plugins.ShedReasonHeader)
	}
	if msg := routed(other)(); msg != "" {
		t.Fatalf("a tenant the policy does not cap: %s", msg)
	}

	if err := c.Delete(ctx, policy); err != nil {
		t.Fatal(err)
	}
	runnertest.Eventually(t, "with the policy deleted, the defaults route the batch tenant again", routed(batch))
}
