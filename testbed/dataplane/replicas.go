package dataplane

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
)

// How the proxy spreads ext_proc streams over EPP replicas (Config.EPPBalance).
const (
	BalanceRoundRobin = "round-robin"
	BalanceRandom     = "random"
)

// The HTTP/2 receive windows of GIE's Envoy configuration for its ext_proc cluster (GIE v1.5.0
// config/charts/standalone/values.yaml and test/testdata/envoy.yaml, http2_protocol_options
// initial_stream_window_size and initial_connection_window_size; examples/envoy/envoy.yaml here). Envoy's windows are
// fixed (Http2ProtocolOptions has no adaptive window, and its PINGs are connection_keepalive, off by default): it sends
// a WINDOW_UPDATE as the EPP's answers are consumed and no PING to estimate the link. gRPC's client
// by default estimates it (BDP): a connection WINDOW_UPDATE and a PING for nearly every burst of answers, which the
// EPP must read and acknowledge, and which Envoy never sends; the data plane keeps Envoy's fixed windows instead.
const (
	EnvoyExtProcStreamWindow = 64 << 10
	EnvoyExtProcConnWindow   = 1 << 20
)

// eppReplicas are the EPP's replicas, one gRPC client each. Envoy opens an
// ext_proc stream per request and its load balancer picks the host of each
// new stream; pick does the same, so the replicas share requests, never
// clients or tenants.
type eppReplicas struct {
	conns   []*grpc.ClientConn
	clients []extprocv3.ExternalProcessorClient
	random  bool
	next    atomic.Uint64
}

// newEPPReplicas creates a lazy gRPC client per address (New succeeds while
// the EPPs are starting).
func newEPPReplicas(addresses []string, balance string, creds credentials.TransportCredentials) (*eppReplicas, error) {
	r := &eppReplicas{random: balance == BalanceRandom}
	for _, a := range addresses {
		conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(creds),
			grpc.WithStaticStreamWindowSize(EnvoyExtProcStreamWindow), grpc.WithStaticConnWindowSize(EnvoyExtProcConnWindow))
		if err != nil {
			_ = r.Close()
			return nil, fmt.Errorf("creating EPP client for %s: %w", a, err)
		}
		r.conns = append(r.conns, conn)
		r.clients = append(r.clients, extprocv3.NewExternalProcessorClient(conn))
	}
	return r, nil
}

// pick returns the client of the next stream's replica. As Envoy's load balancer does with the hosts its health
// checking and outlier detection ejected from the ext_proc cluster, it passes over a replica whose connection is
// failing and spreads the streams evenly over the others (round-robin or at random among them). Under half the
// replicas live, it picks among all of them, as Envoy's panic mode (healthy_panic_threshold, 50% by default) does.
// Safe for concurrent use.
func (r *eppReplicas) pick() extprocv3.ExternalProcessorClient {
	n := len(r.clients)
	if n == 1 {
		return r.clients[0]
	}
	turn := r.next.Add(1) - 1
	failing := func(k int) bool { return r.conns[k].GetState() == connectivity.TransientFailure }
	live := 0
	for k := range n {
		if !failing(k) {
			live++
		}
	}
	panicking := 2*live < n
	if panicking {
		live = n
	}
	j := int(turn % uint64(live))
	if r.random {
		j = rand.IntN(live)
	}
	for k := range n {
		if panicking || !failing(k) {
			if j == 0 {
				return r.clients[k]
			}
			j--
		}
	}
	return r.clients[0] // a connection failed between the two looks
}

// Close closes every replica's connection.
func (r *eppReplicas) Close() error {
	var errs []error
	for _, c := range r.conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
