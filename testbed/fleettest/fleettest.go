package fleettest

import (
	"context"
	"net"
	"net/http"
	"testing"

	"github.com/sluice-gw/sluice/testbed/dataplane"
	"github.com/sluice-gw/sluice/testbed/simulator"
)

// StartSimulator serves a simulated vLLM server with opts on hostPort (port 0 picks one) until the test ends and
// returns its host:port.
func StartSimulator(t testing.TB, hostPort string, opts simulator.Options) string {
	t.Helper()
	srv, err := simulator.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", hostPort)
	if err != nil {
		srv.Close()
		t.Fatalf("a simulated model server needs %s: %v", hostPort, err)
	}
	hs := &http.Server{Handler: srv}
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() {
		_ = hs.Close()
		srv.Close()
	})
	return l.Addr().String()
}

// StartDataPlane serves a data plane with cfg on a free loopback port until the test ends and returns its base URL.
func StartDataPlane(t testing.TB, cfg dataplane.Config) string {
	t.Helper()
	p, err := dataplane.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Serve(ctx, l)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = p.Close()
	})
	return "http://" + l.Addr().String()
}
