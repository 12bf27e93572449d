package runner_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// TestKubernetesMode runs the EPP binary against a real API server, as it
// runs in a cluster: InferencePool and Pods come from the API, and routing
// follows pod readiness and deletion.
func TestKubernetesMode(t *testing.T) {
	api := runnertest.StartAPIServer(t, nil)
	port := runnertest.FreePort(t)
	a := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.2:%d", port)).Addr
	b := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.3:%d", port)).Addr
	api.CreatePool(t, port)
	podA := api.CreateReadyPod(t, "vllm-a", "127.0.0.2")
	podB := api.CreateReadyPod(t, "vllm-b", "127.0.0.3")

	epp := runnertest.StartEPP(t, []string{"KUBECONFIG=" + api.Kubeconfig, "NAMESPACE=default"},
		"--pool-name=vllm", "--secure-serving=false")
	tls := false

	runnertest.Eventually(t, "both Ready pods receive traffic", func() string {
		seen := destinations(t, epp.GRPCPort, tls, 20, nil)
		if msg := onlyIn(seen, a, b); msg != "" {
			return msg
		}
		if len(seen) != 2 {
			return fmt.Sprintf("only %v received traffic", seen)
		}
		return ""
	})
	if msg := onlyIn(destinations(t, epp.GRPCPort, tls, 10, []string{a}), a); msg != "" {
		t.Fatalf("subset hint ignored: %s", msg)
	}

	api.SetPodReady(t, podB, "127.0.0.3", false)
	runnertest.Eventually(t, "a NotReady pod stops receiving traffic", func() string { return onlyIn(destinations(t, epp.GRPCPort, tls, 10, nil), a) })

	api.SetPodReady(t, podB, "127.0.0.3", true)
	if err := api.Client.Delete(context.Background(), podA); err != nil {
		t.Fatal(err)
	}
	runnertest.Eventually(t, "a deleted pod stops receiving traffic", func() string { return onlyIn(destinations(t, epp.GRPCPort, tls, 10, nil), b) })
}

// TestKubernetesModeAfterAPIServerOutage stops the API server twice: the EPP keeps routing on what it knows, and
// once the API server is back it sees the next change at once: a pod deleted then stops receiving traffic within
// afterOutage. client-go's reflector, left to itself, retries a refused watch after 0.8 s, then twice as long each
// time (up to 30 s, plus up to as much again of jitter), and forgets its back-off only after 2 minutes: after the
// first outage (12 s) it resumes 0-14 s after the API server is back, after the second (1 s) 13-25 s after; the
// EPP's informers retry every 200 ms instead. The wait is an order of magnitude above that retry and below the
// reflector's back-off after the second outage, which it exists to tell apart.
func TestKubernetesModeAfterAPIServerOutage(t *testing.T) {
	const afterOutage = 4 * time.Second
	api := runnertest.StartAPIServer(t, nil)
	port := runnertest.FreePort(t)
	a := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.2:%d", port)).Addr
	b := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.3:%d", port)).Addr
	api.CreatePool(t, port)
	api.CreateReadyPod(t, "vllm-b", "127.0.0.3")
	epp := runnertest.StartEPP(t, []string{"KUBECONFIG=" + api.Kubeconfig, "NAMESPACE=default"},
		"--pool-name=vllm", "--secure-serving=false")
	bothRouted := func() string {
		if seen := destinations(t, epp.GRPCPort, false, 20, nil); len(seen) != 2 {
			return fmt.Sprintf("only %v received traffic", seen)
		}
		return ""
	}
	for _, outage := range []time.Duration{12 * time.Second, time.Second} {
		podA := api.CreateReadyPod(t, "vllm-a", "127.0.0.2")
		runnertest.Eventually(t, "both Ready pods receive traffic", bothRouted)
		api.Stop(t)
		time.Sleep(outage)
		if msg := bothRouted(); msg != "" {
			t.Fatalf("during an outage of %v: %s", outage, msg)
		}
		api.Restart(t)
		if err := api.Client.Delete(context.Background(), podA); err != nil {
			t.Fatal(err)
		}
		deleted := time.Now()
		for {
			msg := onlyIn(destinations(t, epp.GRPCPort, false, 10, nil), b)
			if msg == "" {
				break
			}
			if time.Since(deleted) > afterOutage {
				t.Fatalf("%s still routed to %v after its deletion following an outage of %v: %s", podA.Name, afterOutage, outage, msg)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("after an outage of %v, %s (%s) left %v after its deletion", outage, podA.Name, a, time.Since(deleted).Round(time.Millisecond))
	}
}

// TestLeaderElection runs two EPP replicas with leader election against a real
// API server: both are live, and the leader (only) reports ready, as
// upstream's replicas do behind one Service.
func TestLeaderElection(t *testing.T) {
	api := runnertest.StartAPIServer(t, nil)
	port := runnertest.FreePort(t)
	runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.2:%d", port))
	api.CreatePool(t, port)
	api.CreateReadyPod(t, "vllm-a", "127.0.0.2")
	env := []string{"KUBECONFIG=" + api.Kubeconfig, "NAMESPACE=default"}
	args := []string{"--pool-name=vllm", "--secure-serving=false", "--ha-enable-leader-election"}
	leader := runnertest.StartEPP(t, env, args...) // returns once ready, i.e. elected
	follower := runnertest.StartEPPUnready(t, env, args...)
	for _, check := range []struct {
		p       *runnertest.Process
		service string
		want    bool
	}{
		{leader, "readiness", true},
		{leader, "liveness", true},
		{follower, "liveness", true},
		{follower, "readiness", false},
	} {
		if got := runnertest.Serving(t, check.p, check.service); got != check.want {
			t.Errorf("%s on port %d: serving = %v, want %v", check.service, check.p.HealthPort, got, check.want)
		}
	}
	var lease coordinationv1.Lease
	key := client.ObjectKey{Namespace: "default", Name: "epp-default-vllm.gateway-api-inference-extension.sigs.k8s.io"}
	if err := api.Client.Get(context.Background(), key, &lease); err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("no lease held under upstream's lease name: %v", err)
	}
}
