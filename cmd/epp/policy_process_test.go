package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
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

// policyFixture is an EPP in Kubernetes mode with Sluice admission in front of one (fake) model server whose
// saturation is 1/2 = 0.5 (one waiting over the default queue-depth threshold of 2): headroom for every band under
// the defaults (Sheddable's ceiling is 0.6), none for a Sheddable ceiling of 0.2.
type policyFixture struct {
	t      *testing.T
	api    *runnertest.APIServer
	epp    *runnertest.Process
	server string
	prompt int
}

func startPolicyFixture(t *testing.T, api *runnertest.APIServer) *policyFixture {
	t.Helper()
	port := runnertest.FreePort(t)
	server := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.2:%d", port))
	server.Waiting.Store(1)
	api.CreatePool(t, port)
	api.CreateReadyPod(t, "vllm-a", "127.0.0.2")
	epp := runnertest.StartEPP(t, []string{"KUBECONFIG=" + api.Kubeconfig, "NAMESPACE=default"},
		"--pool-name=vllm", "--secure-serving=false", "--sluice-admission")
	return &policyFixture{t: t, api: api, epp: epp, server: server.Addr}
}

var (
	batchTenant = map[string]string{"x-gateway-inference-fairness-id": "batch"}
	otherTenant = map[string]string{"x-gateway-inference-fairness-id": "other"}
)

func (f *policyFixture) route(headers map[string]string) runnertest.Answer {
	f.prompt++
	body := map[string]any{"model": "base", "prompt": fmt.Sprintf("prompt %d", f.prompt), "max_tokens": 16}
	return runnertest.Route(f.t, f.epp.GRPCPort, false, headers, body, nil)
}

func (f *policyFixture) routed(headers map[string]string) func() string {
	return func() string {
		if a := f.route(headers); a.Destination != f.server {
			return fmt.Sprintf("answer %+v, want routed to %s", a, f.server)
		}
		return ""
	}
}

// capBatch creates a policy that caps the batch tenant to Sheddable with a ceiling of 0.2, waits until it is
// accepted and in force, and checks that it sheds the batch tenant only.
func (f *policyFixture) capBatch(ctx context.Context) *crds.FlowControlPolicy {
	t := f.t
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
	runnertest.Eventually(t, "the API server accepts the policy", func() string {
		if err := f.api.Client.Create(ctx, policy); err != nil {
			return err.Error()
		}
		return ""
	})
	runnertest.Eventually(t, "the policy is accepted", func() string {
		var got crds.FlowControlPolicy
		if err := f.api.Client.Get(ctx, client.ObjectKeyFromObject(policy), &got); err != nil {
			return err.Error()
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, crds.ConditionAccepted) {
			return fmt.Sprintf("conditions %+v", got.Status.Conditions)
		}
		return ""
	})

	var shed runnertest.Answer
	runnertest.Eventually(t, "the accepted policy sheds the capped tenant", func() string {
		if shed = f.route(batchTenant); shed.Status == 0 {
			return fmt.Sprintf("still routed (%+v): the policy is not in force yet", shed)
		}
		return ""
	})
	if shed.Status != 429 || shed.Headers[plugins.ShedReasonHeader] != "saturated" || shed.Headers["retry-after"] == "" {
		t.Fatalf("batch answer %+v, want 429 with %s: saturated and a Retry-After", shed, plugins.ShedReasonHeader)
	}
	if msg := f.routed(otherTenant)(); msg != "" {
		t.Fatalf("a tenant the policy does not cap: %s", msg)
	}
	return policy
}

// TestFlowControlPolicyLive runs the EPP binary in Kubernetes mode with Sluice admission and shows a
// FlowControlPolicy taking effect without a restart: a tenant routed under the defaults is capped to Sheddable and
// shed (429, saturated) once the policy is accepted, and routed again once it is deleted.
func TestFlowControlPolicyLive(t *testing.T) {
	api := runnertest.StartAPIServer(t, []string{filepath.Join("..", "..", "crds", "manifests")}, crds.AddToScheme)
	ctx := context.Background()
	f := startPolicyFixture(t, api)
	runnertest.Eventually(t, "without a policy, the batch tenant is routed", f.routed(batchTenant))

	policy := f.capBatch(ctx)
	if err := api.Client.Delete(ctx, policy); err != nil {
		t.Fatal(err)
	}
	runnertest.Eventually(t, "with the policy deleted, the defaults route the batch tenant again", f.routed(batchTenant))
}

// TestFlowControlPolicyCRDInstalledAfterStart turns Sluice admission on against an API server without the
// FlowControlPolicy CRD, as someone who swaps the image into an existing install does: the EPP starts on the flags'
// policy and says once that the CRD is absent; once the CRD is installed, a policy takes effect without a restart.
func TestFlowControlPolicyCRDInstalledAfterStart(t *testing.T) {
	api := runnertest.StartAPIServer(t, nil, crds.AddToScheme)
	ctx := context.Background()
	f := startPolicyFixture(t, api)
	runnertest.Eventually(t, "without the CRD, the batch tenant is routed", f.routed(batchTenant))

	api.InstallCRDs(t, filepath.Join("..", "..", "crds", "manifests"))
	f.capBatch(ctx)
	const absent = "The FlowControlPolicy CRD is not installed"
	if n := strings.Count(f.epp.Output.String(), absent); n != 1 {
		t.Errorf("the EPP logged %q %d times, want once:\n%s", absent, n, f.epp.Output.String())
	}
}
