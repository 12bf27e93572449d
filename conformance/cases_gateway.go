package conformance

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/sluice-gw/sluice/conformance/gateway"
	"github.com/sluice-gw/sluice/runner/runnertest"
)

// The EPP side of upstream's Gateway profile, locally: each implementation
// runs exactly as the EPP Deployments of upstream's conformance manifests
// (resources/base.yaml) run it, with their arguments, their
// EndpointPickerConfig (the header-based testing filter and the
// destination-endpoint-served verifier), their health probe and the RBAC
// their Role grants, and gets the requests upstream's Gateway tests send.
// `make conformance-gateway` runs the Gateway tests themselves in a cluster.

// testSelectionHeader names the endpoints the header-based testing filter
// keeps; servedVerifierHeader is where the served-endpoint verifier writes
// what the proxy reported.
const (
	testSelectionHeader  = "test-epp-endpoint-selection"
	servedVerifierHeader = "x-conformance-test-served-endpoint"
)

// gatewayTestRequest is the request upstream's Gateway tests send
// (tests/gateway_following_epp_routing.go).
func gatewayTestRequest(selection string) Request {
	return Request{
		Path:    "/primary-gateway-test",
		Headers: map[string]string{testSelectionHeader: selection},
		Body: []byte(`{
            "model": "conformance-fake-model",
            "prompt": "Write as if you were a critic: San Francisco"
        }`),
	}
}

var gatewayManifestGroup = Group{
	Name:    "GatewayProfileManifest",
	Fixture: &FixtureSpec{Pods: 3, Ranks: 2, Manifest: true},
	Cases: []Case{
		{
			Name: "ReadyUnderManifestRBAC", Profile: EPPProfile,
			Ref:         Ref{Module: "conformance", Path: "resources/base.yaml", Line: 283, Quote: "service: inference-extension"},
			Requirement: "Started with the manifests' arguments, configuration and Role only, the EPP passes their readiness probe (gRPC health service inference-extension) and stays live.",
			Run: func(t *T, f *Fixture) {
				for _, svc := range []string{"inference-extension", "liveness"} {
					if !runnertest.Serving(t, f.EPP, svc) {
						t.Errorf("health service %q not SERVING", svc)
					}
				}
				t.Observe("health", "%s", healthStatuses(t, f.EPP, "inference-extension"))
			},
		},
		{
			Name: "SelectionHeaderOneIP", Profile: EPPProfile,
			Ref:         Ref{Module: "conformance", Path: "tests/gateway_following_epp_routing.go", Line: 101, Quote: "test.HeaderTestEppEndPointSelectionKey: podIPs[i],"},
			Requirement: "With the test-epp-endpoint-selection header naming a pod's IP, every request goes to that pod.",
			Run: func(t *T, f *Fixture) {
				ip := f.Endpoints[1][0].IP
				for range 10 {
					eps := f.route(t, gatewayTestRequest(ip))
					if host, _, _ := net.SplitHostPort(eps[0]); host != ip {
						t.Fatalf("routed to %s, want pod %s", eps[0], ip)
					}
				}
				t.Observe("selection", "followed")
			},
		},
		{
			Name: "SelectionHeaderList", Profile: EPPProfile,
			Ref:         Ref{Module: "conformance", Path: "tests/gateway_following_epp_routing.go", Line: 139, Quote: "test.HeaderTestEppEndPointSelectionKey: eppHeaderValue,"},
			Requirement: "With the header naming two pods, every request goes to one of them.",
			Run: func(t *T, f *Fixture) {
				a, b := f.Endpoints[0][0].IP, f.Endpoints[2][0].IP
				for range 10 {
					eps := f.route(t, gatewayTestRequest(a+","+b))
					if host, _, _ := net.SplitHostPort(eps[0]); host != a && host != b {
						t.Fatalf("routed to %s, want %s or %s", eps[0], a, b)
					}
				}
				t.Observe("selection", "followed")
			},
		},
		{
			Name: "SelectionHeaderIPAndPort", Profile: EPPProfile,
			Ref:         Ref{Module: "conformance", Path: "tests/gateway_following_epp_routing_dp.go", Line: 156, Quote: "test.HeaderTestEppEndPointSelectionKey: eppHeaderValue,"},
			Requirement: "On a data-parallel pool, the header naming ip:port selects exactly that rank.",
			Run: func(t *T, f *Fixture) {
				rank := f.Endpoints[0][1].Addr()
				for range 5 {
					if eps := f.route(t, gatewayTestRequest(rank)); eps[0] != rank {
						t.Fatalf("routed to %s, want rank %s", eps[0], rank)
					}
				}
				t.Observe("selection", "followed")
			},
		},
		{
			Name: "NoSelectionHeader", Profile: EPPProfile,
			Ref:         Ref{Path: proposal004, Line: 74, Quote: "If the EPP did not communicate the server endpoint via these two methods, it MUST return an error"},
			Requirement: "Without the header the configuration leaves no endpoint: the request gets an immediate error (429 or 503), not a broken stream.",
			Run: func(t *T, f *Fixture) {
				req := gatewayTestRequest("")
				delete(req.Headers, testSelectionHeader)
				f.requireImmediate(t, req, 429, 503)
			},
		},
		{
			Name: "ServedEndpointVerifier", Profile: EPPProfile,
			Ref:         Ref{Module: "conformance", Path: "tests/gateway_destination_endpoint_served.go", Line: 100, Quote: "test.ConformanceTestResultHeader: podIPs[i] + \":3000\""},
			Requirement: "The destination-endpoint-served verifier echoes the envoy.lb served endpoint in x-conformance-test-served-endpoint, and reports its absence.",
			Run: func(t *T, f *Fixture) {
				ep := f.Endpoints[2][0]
				req := gatewayTestRequest(ep.IP)
				req.Response = ChatCompletionReply("conformance-fake-model")
				req.Response.Served = ep.Addr()
				d := f.exchange(t, req)
				if got := d.ResponseHeaders[servedVerifierHeader]; got != ep.Addr() {
					t.Errorf("%s = %q, want the served endpoint %s", servedVerifierHeader, got, ep.Addr())
				}
				req = gatewayTestRequest(ep.IP)
				req.Response = ChatCompletionReply("conformance-fake-model")
				d = f.exchange(t, req)
				t.Observe("without-served-metadata", "%s", orDash(d.ResponseHeaders[servedVerifierHeader]))
				if got := d.ResponseHeaders[servedVerifierHeader]; got == "" || got == ep.Addr() {
					t.Errorf("without served metadata %s = %q, want the verifier's failure report", servedVerifierHeader, got)
				}
			},
		},
	},
}

// gatewayProfileEPP starts the implementation as the manifests' primary EPP
// Deployment does: its arguments (pool and namespace renamed to the
// fixture's, the mounted configuration written to a file, ports left to
// StartBinary), the implementation's own flags, and the identity of the
// namespace's default ServiceAccount bound to the manifests' Role. It waits
// on the health service the Deployment's readiness probe asks for.
func gatewayProfileEPP(t testing.TB, f *Fixture, spec *FixtureSpec) *runnertest.Process {
	t.Helper()
	manifest, err := gateway.BaseManifest()
	if err != nil {
		t.Fatal(err)
	}
	deps, err := gateway.EPPDeployments(manifest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := gateway.EndpointPickerConfig(manifest)
	if err != nil {
		t.Fatal(err)
	}
	role, binding, err := gateway.EPPRBAC(manifest)
	if err != nil {
		t.Fatal(err)
	}
	sa := binding.Subjects[0].Name
	f.grant(t, role, binding, sa)
	for _, file := range f.Impl.RBAC {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		role, binding, err := gateway.EPPRBAC(data)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		f.grant(t, role, binding, sa)
	}
	kubeconfig := f.API.KubeconfigFor(t, "system:serviceaccount:"+f.Namespace+":"+sa,
		"system:serviceaccounts", "system:serviceaccounts:"+f.Namespace)

	path := filepath.Join(t.TempDir(), "conformance-plugins.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	args, err := replaceArgs(deps[0].Args, map[string]string{
		"--pool-name": f.Pool, "--pool-namespace": f.Namespace, "--config-file": path,
	})
	if err != nil {
		t.Fatal(err)
	}
	args = append(append(args, f.Impl.Args...), spec.Args...)
	return runnertest.StartBinary(t, f.Impl.Binary, []string{"KUBECONFIG=" + kubeconfig}, deps[0].ProbeService, args...)
}

// grant creates role and binding in the fixture's namespace, bound to its
// ServiceAccount sa.
func (f *Fixture) grant(t testing.TB, role *rbacv1.Role, binding *rbacv1.RoleBinding, sa string) {
	t.Helper()
	role.Namespace, binding.Namespace = f.Namespace, f.Namespace
	binding.Subjects = []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: f.Namespace}}
	f.create(t, role)
	f.create(t, binding)
}

// replaceArgs returns args with the value following each flag of values
// replaced; every flag must occur.
func replaceArgs(args []string, values map[string]string) ([]string, error) {
	out := append([]string(nil), args...)
	found := 0
	for i := 0; i+1 < len(out); i++ {
		if v, ok := values[out[i]]; ok {
			out[i+1] = v
			found++
		}
	}
	if found != len(values) {
		return nil, errors.New("the manifest's EPP arguments lack --pool-name, --pool-namespace or --config-file")
	}
	return out, nil
}
