package runner

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/sluice-gw/sluice/flowcontrol/replication"
	"github.com/sluice-gw/sluice/runner/runnertest"
)

// TestPeersFromEndpointSlices runs the EndpointSlice watch against a real API server: the peers are the ready
// addresses, on the health port, of the Service's slices only, and follow readiness and deletion.
func TestPeersFromEndpointSlices(t *testing.T) {
	api := runnertest.StartAPIServer(t, nil)
	cfg, err := clientcmd.BuildConfigFromFlags("", api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	opts := ctrl.Options{Scheme: clientgoscheme.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}}
	peersCache(&opts, "default", "epp")
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	view, err := replication.NewView("10.0.0.1:9003", nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	err = setupPeerSlices(mgr, &peerSlices{reader: mgr.GetClient(), view: view, namespace: "default", service: "epp",
		port: "9003", logger: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	slice := func(name, service string, ready map[string]bool) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		for _, addr := range slices.Sorted(func(yield func(string) bool) {
			for a := range ready {
				if !yield(a) {
					return
				}
			}
		}) {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready[addr])}})
		}
		return s
	}
	c := api.Client
	first := slice("epp-a", "epp", map[string]bool{"10.0.0.1": true, "10.0.0.2": true, "10.0.0.3": false})
	for _, s := range []*discoveryv1.EndpointSlice{first,
		slice("epp-b", "epp", map[string]bool{"10.0.0.4": true}),
		slice("other-a", "other", map[string]bool{"10.0.0.9": true})} {
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	peersAre := func(want string) func() string {
		return func() string {
			if got := strings.Join(view.Peers(), ","); got != want {
				return "peers " + got + ", want " + want
			}
			return ""
		}
	}
	runnertest.Eventually(t, "the Service's ready endpoints are the peers", peersAre("10.0.0.2:9003,10.0.0.4:9003"))

	first.Endpoints[1].Conditions.Ready = ptr.To(false) // 10.0.0.2 no longer ready (e.g. terminating)
	if err := c.Update(ctx, first); err != nil {
		t.Fatal(err)
	}
	runnertest.Eventually(t, "a replica no longer ready is no peer", peersAre("10.0.0.4:9003"))

	if err := c.Delete(ctx, slice("epp-b", "epp", nil)); err != nil {
		t.Fatal(err)
	}
	runnertest.Eventually(t, "a deleted slice's replicas are no peers", peersAre(""))
}

func TestSlicePeers(t *testing.T) {
	items := []discoveryv1.EndpointSlice{
		{Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.2"}}, // no condition: ready
			{Addresses: []string{"fd00::1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}, //
			{Addresses: []string{"10.0.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
		}},
		{Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.2"}}}}, // in two slices: once
	}
	if got, want := strings.Join(slicePeers(items, "9003", "epp-a"), ","), "10.0.0.2:9003,[fd00::1]:9003"; got != want {
		t.Fatalf("peers %s, want %s", got, want)
	}

	// A dual-stack Service: one slice per family, each pod in both.
	dual := []discoveryv1.EndpointSlice{
		{AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.2"}}, {Addresses: []string{"10.0.0.4"}}}},
		{AddressType: discoveryv1.AddressTypeIPv6, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"fd00::2"}}, {Addresses: []string{"fd00::4"}}}},
	}
	for _, tc := range []struct{ self, want string }{
		{"10.0.0.2:9003", "10.0.0.2:9003,10.0.0.4:9003"},
		{"[fd00::2]:9003", "[fd00::2]:9003,[fd00::4]:9003"},
		{"epp-a", "10.0.0.2:9003,10.0.0.4:9003,[fd00::2]:9003,[fd00::4]:9003"}, // not an address: no family to keep
	} {
		if got := strings.Join(slicePeers(dual, "9003", tc.self), ","); got != tc.want {
			t.Errorf("self %s: peers %s, want %s", tc.self, got, tc.want)
		}
	}
}

func TestReplicaNameDerived(t *testing.T) {
	local := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.1.2.3")}
	for _, tc := range []struct {
		peers []string
		want  string // or the error's text
	}{
		{[]string{"127.0.0.1:9003", "192.0.2.1:9003", "127.0.0.1:9004"}, "127.0.0.1:9003"},
		{[]string{"localhost:9003", "192.0.2.1:9003"}, "localhost:9003"},
		{[]string{"192.0.2.1:9003", "192.0.2.2:9003"}, "0 of [192.0.2.1:9003 192.0.2.2:9003] are on --grpc-health-port 9003"},
		{[]string{"127.0.0.1:9003", "10.1.2.3:9003"}, "2 of"},
	} {
		got, err := staticPeerName(context.Background(), tc.peers, local, "9003")
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("%v: %q, want %q", tc.peers, got, tc.want)
		}
	}
	if got, err := podPeerName(local, "9003"); got != "10.1.2.3:9003" || err != nil {
		t.Errorf("pod name %q, %v; want 10.1.2.3:9003", got, err)
	}
	if _, err := podPeerName(local[:1], "9003"); err == nil || !strings.Contains(err.Error(), "--replica-id") {
		t.Errorf("only loopback: %v, want an error naming --replica-id", err)
	}
}

type syncedPool struct{}

func (syncedPool) PoolHasSynced() bool { return true }

// The prober hears a peer whose health service serves, and the peer stops being live once it is gone: with a short
// timeout, by the timeout or its refused connection; with a timeout longer than the test, by its refused connection
// alone (a killed replica's endpoints are taken over at the next probe, not after --peer-timeout).
func TestPeerProberFollowsAPeer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
	}{
		{name: "gone by its timeout or refused connection", timeout: 150 * time.Millisecond},
		{name: "gone by its refused connection", timeout: time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, peer, view := probedPeer(t, &healthServer{logger: testr.New(t), pool: syncedPool{}, isLeader: &atomic.Bool{}}, tc.timeout)
			live := func(want string) func() string {
				return func() string {
					if got := strings.Join(view.Live(time.Now()), ","); got != want {
						return "live " + got + ", want " + want
					}
					return ""
				}
			}
			runnertest.Eventually(t, "a serving peer is heard", live(strings.Join(slices.Sorted(slices.Values([]string{"127.0.0.1:1", peer})), ",")))
			srv.Stop() // closes the listener: connections to the peer are refused from now on
			runnertest.Eventually(t, "a stopped peer is gone", live("127.0.0.1:1"))
		})
	}
}

// blockingHealth answers SERVING until slow is set; from then on each Check waits for its caller to give up, as a
// live peer too busy to answer does.
type blockingHealth struct {
	healthpb.UnimplementedHealthServer
	slow      atomic.Bool
	slowCalls atomic.Int32
}

func (h *blockingHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if h.slow.Load() {
		h.slowCalls.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// A peer that stops answering on a live connection is slow, not gone: it stays live until its timeout (here longer
// than the test), however many probes time out meanwhile; only a failed connection attempt drops it early.
func TestPeerProberKeepsASlowPeer(t *testing.T) {
	health := &blockingHealth{}
	_, peer, view := probedPeer(t, health, time.Hour)
	both := strings.Join(slices.Sorted(slices.Values([]string{"127.0.0.1:1", peer})), ",")
	live := func() string { return strings.Join(view.Live(time.Now()), ",") }
	runnertest.Eventually(t, "a serving peer is heard", func() string {
		if got := live(); got != both {
			return "live " + got + ", want " + both
		}
		return ""
	})
	health.slow.Store(true)
	runnertest.Eventually(t, "five probes of the slow peer time out", func() string {
		if n := health.slowCalls.Load(); n < 6 { // the sixth has begun: five have ended
			return fmt.Sprintf("%d slow probes", n)
		}
		return ""
	})
	if got := live(); got != both {
		t.Errorf("live %s after the peer's probes timed out, want %s: a slow peer was dropped before its timeout", got, both)
	}
}

// probedPeer serves health as a peer's health service on a loopback port, and probes it every 20 ms from the view of
// replica 127.0.0.1:1 whose peers stay live for timeout; both stop with the test.
func probedPeer(t *testing.T, health healthpb.HealthServer, timeout time.Duration) (*grpc.Server, string, *replication.View) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	peer := l.Addr().String()
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)

	view, err := replication.NewView("127.0.0.1:1", []string{"127.0.0.1:1", peer}, timeout)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- (&peerProber{view: view, interval: 20 * time.Millisecond, clock: clock.RealClock{}, logger: testr.New(t)}).Start(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return srv, peer, view
}
