package conformance

import (
	"fmt"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// gRPC health as the deployments use it: upstream's manifests probe the
// health port (service "inference-extension" in the conformance manifests,
// "liveness"/"readiness" in the Helm chart), and a Service sends traffic
// only to a ready replica.

// probedServices are the health services deployments and load balancers ask
// for: the empty name, the chart's, the conformance manifests', ext_proc's.
var probedServices = []string{"", "readiness", "liveness", "inference-extension", extprocv3.ExternalProcessor_ServiceDesc.ServiceName}

// startupGroup deploys the EPP as upstream's manifests and chart do: with
// GIE's CRDs installed and nothing else.
var startupGroup = Group{
	Name:        "Startup",
	GIECRDsOnly: true,
	Cases: []Case{{
		Name: "ReadyWithOnlyGIECRDs", Profile: EPPProfile,
		Ref:         Ref{Module: "conformance", Path: "scripts/istio/README.md", Line: 72, Quote: "make setup-inference-extension-crds     # Apply Inference Extension CRDs"},
		Requirement: "On a cluster with only the Inference Extension CRDs (as upstream's conformance environment sets up), the EPP starts, becomes ready and routes.",
		Run: func(t *T, f *Fixture) {
			spec := &FixtureSpec{Pods: 1}
			f.Populate(t, spec)
			f.Start(t, spec)
			t.Observe("ready", "true")
		},
	}},
}

var healthGroup = Group{
	Name: "Health",
	Cases: []Case{
		{
			Name: "NotServingUntilPoolSynced", Profile: EPPProfile,
			Ref:         Ref{Path: "cmd/epp/runner/health.go", Line: 53, Quote: "return &healthPb.HealthCheckResponse{Status: healthPb.HealthCheckResponse_NOT_SERVING}, nil"},
			Requirement: "Without leader election, health is NOT_SERVING until the InferencePool is known and SERVING after, for every service name probes use.",
			Run: func(t *T, f *Fixture) {
				f = newFixture(t, f.Env, "Health-Sync", nil)
				epp := f.StartEPP(t, "", nil) // the pool does not exist yet
				t.Observe("before-sync", "%s", healthStatuses(t, epp, probedServices...))
				for _, svc := range probedServices {
					if st, _ := runnertest.HealthStatus(epp, svc); st == healthpb.HealthCheckResponse_SERVING {
						t.Errorf("service %q SERVING before the InferencePool exists", svc)
					}
				}
				spec := &FixtureSpec{Pods: 1}
				f.Populate(t, spec)
				runnertest.Eventually(t, "health turns SERVING once the pool is known", func() string {
					if !runnertest.Serving(t, epp, "readiness") {
						return "readiness not serving"
					}
					return ""
				})
				t.Observe("after-sync", "%s", healthStatuses(t, epp, probedServices...))
				for _, svc := range probedServices {
					if !runnertest.Serving(t, epp, svc) {
						t.Errorf("service %q not SERVING after the pool synced", svc)
					}
				}
			},
		},
		{
			Name: "LeaderElection", Profile: EPPProfile,
			Ref:         Ref{Path: "cmd/epp/runner/health.go", Line: 67, Quote: "isPassing = isLive && s.isLeader.Load()"},
			Requirement: "With --ha-enable-leader-election, the leader is ready and the follower live but not ready; when the leader stops, the follower takes over and routes.",
			Run: func(t *T, f *Fixture) {
				f = newFixture(t, f.Env, "Health-Leader", nil)
				spec := &FixtureSpec{Pods: 1, Args: []string{"--ha-enable-leader-election"}}
				f.Populate(t, spec)
				leader := f.StartEPP(t, "readiness", spec)
				follower := f.StartEPP(t, "liveness", spec)
				for _, c := range []struct {
					p       *runnertest.Process
					who     string
					service string
					want    bool
				}{
					{leader, "leader", "readiness", true},
					{leader, "leader", "liveness", true},
					{follower, "follower", "liveness", true},
					{follower, "follower", "readiness", false},
				} {
					if got := runnertest.Serving(t, c.p, c.service); got != c.want {
						t.Errorf("%s %s: serving = %v, want %v", c.who, c.service, got, c.want)
					}
				}
				t.Observe("leader", "%s", healthStatuses(t, leader, "readiness", "liveness"))
				t.Observe("follower", "%s", healthStatuses(t, follower, "readiness", "liveness"))
				if err := leader.Stop(); err != nil {
					t.Fatal(err)
				}
				runnertest.Eventually(t, "the follower takes over once the leader stopped", func() string {
					if !runnertest.Serving(t, follower, "readiness") {
						return "follower readiness not serving"
					}
					return ""
				})
				envoy, err := DialEnvoy(fmt.Sprintf("127.0.0.1:%d", follower.GRPCPort), false)
				if err != nil {
					t.Fatal(err)
				}
				defer envoy.Close()
				f.EPP, f.Envoy = follower, envoy
				f.WaitRoutesTo(t, f.AllAddrs()...)
				t.Observe("takeover", "routed")
			},
		},
	},
}

// healthStatuses renders each service's status: "svc=SERVING ...".
func healthStatuses(t *T, p *runnertest.Process, services ...string) string {
	t.Helper()
	var out string
	for _, svc := range services {
		st, err := runnertest.HealthStatus(p, svc)
		v := st.String()
		if err != nil {
			v = "error"
		}
		name := svc
		if name == "" {
			name = `""`
		}
		out += fmt.Sprintf("%s=%s ", name, v)
	}
	return out[:max(len(out)-1, 0)]
}
