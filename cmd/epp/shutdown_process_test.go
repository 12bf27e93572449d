package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/runner/runnertest"
)

// TestShutdownAnswersWaitingRequests stops the EPP as Kubernetes stops a pod (SIGINT) while a request waits in
// Sluice admission: the request is answered 503 shutting_down with Retry-After once the admission's grace ends, and
// only then does the EPP exit, cleanly.
func TestShutdownAnswersWaitingRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("process test: runs the EPP binary")
	}
	server := runnertest.StartModelServer(t, "127.0.0.1:0")
	server.Waiting.Store(50) // saturated throughout: a Standard request waits
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(`
bands:
  standard:
    maxQueueTime: 1m
endpoint:
  metricsStalenessThreshold: 3s # scrapes on a busy test machine can lag
`), 0o600); err != nil {
		t.Fatal(err)
	}
	epp := runnertest.StartEPP(t, nil, "--static-endpoints="+server.Addr, "--secure-serving=false",
		"--flow-control-config="+policy, "--flow-control-shutdown-grace=1s")
	metric := func(series string) func() string {
		return func() string {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", epp.MetricsPort))
			if err != nil {
				return err.Error()
			}
			defer resp.Body.Close()
			page, err := io.ReadAll(resp.Body)
			if err != nil {
				return err.Error()
			}
			if !strings.Contains(string(page), "\n"+series+"\n") {
				return "no " + series + " on /metrics yet"
			}
			return ""
		}
	}
	runnertest.Eventually(t, "the endpoint's metrics are fresh", metric("sluice_flowcontrol_stale_endpoints 0"))

	answered := make(chan runnertest.Answer, 1)
	go func() {
		answered <- runnertest.Route(t, epp.GRPCPort, false, nil, map[string]any{"model": "base", "prompt": "wait", "max_tokens": 8}, nil)
	}()
	runnertest.Eventually(t, "the request waits in admission", metric(`sluice_flowcontrol_queue_length{band="Standard"} 1`))

	exit, err := epp.Interrupt(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if exit != nil {
		t.Errorf("the EPP exited with %v, want status 0", exit)
	}
	select {
	case a := <-answered:
		if a.Status != 503 || a.Headers[plugins.ShedReasonHeader] != "shutting_down" || a.Headers["retry-after"] == "" {
			t.Errorf("the waiting request got %+v, want 503 shutting_down with Retry-After", a)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting request got no answer")
	}
}

// TestShutdownKeepsDispatchingDuringGrace stops the EPP (SIGTERM) while a request waits in Sluice admission for a
// saturated server, then frees the server well after the metrics it had at the signal went stale: the request is
// dispatched to it within admission's shutdown grace, because the EPP keeps scraping until it has stopped.
func TestShutdownKeepsDispatchingDuringGrace(t *testing.T) {
	if testing.Short() {
		t.Skip("process test: runs the EPP binary")
	}
	server := runnertest.StartModelServer(t, "127.0.0.1:0")
	server.Waiting.Store(50)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(`
bands:
  standard:
    maxQueueTime: 1m
endpoint:
  metricsStalenessThreshold: 1s
`), 0o600); err != nil {
		t.Fatal(err)
	}
	epp := runnertest.StartEPP(t, nil, "--static-endpoints="+server.Addr, "--secure-serving=false",
		"--flow-control-config="+policy, "--flow-control-shutdown-grace=20s")
	page := func() string {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", epp.MetricsPort))
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	runnertest.Eventually(t, "the endpoint's metrics are fresh", func() string {
		if !strings.Contains(page(), "\nsluice_flowcontrol_stale_endpoints 0\n") {
			return "stale"
		}
		return ""
	})
	answered := make(chan runnertest.Answer, 1)
	go func() {
		answered <- runnertest.Route(t, epp.GRPCPort, false, nil, map[string]any{"model": "base", "prompt": "wait", "max_tokens": 8}, nil)
	}()
	runnertest.Eventually(t, "the request waits in admission", func() string {
		if !strings.Contains(page(), "\nsluice_flowcontrol_queue_length{band=\"Standard\"} 1\n") {
			return "not queued"
		}
		return ""
	})
	stopped := make(chan error, 1)
	go func() {
		exit, err := epp.Terminate(time.Minute)
		stopped <- errors.Join(exit, err)
	}()
	time.Sleep(2500 * time.Millisecond) // the metrics of the signal's time are stale by now
	server.Waiting.Store(0)
	select {
	case a := <-answered:
		if a.Destination != server.Addr {
			t.Errorf("the waiting request got %+v, want it dispatched to %s during the grace", a, server.Addr)
		}
	case <-time.After(time.Minute):
		t.Fatal("the waiting request got no answer")
	}
	if err := <-stopped; err != nil {
		t.Errorf("the EPP's exit: %v", err)
	}
}
