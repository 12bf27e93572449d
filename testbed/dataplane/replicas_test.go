package dataplane

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// Every request opens one ext_proc stream, and the streams go to the replicas in turn (round-robin) or spread
// over all of them (random), whichever replica routes the request.
func TestEPPReplicasShareStreams(t *testing.T) {
	for _, tc := range []struct {
		balance  string
		requests int
	}{{BalanceRoundRobin, 9}, {BalanceRandom, 60}} {
		t.Run(tc.balance, func(t *testing.T) {
			backend := startBackend(t, "b", nil)
			epps := make([]*fakeEPP, 3)
			for i := range epps {
				epps[i] = startFakeEPP(t, eppBehaviour{decide: routeTo(backend.addr(), nil)})
			}
			proxy, _ := startProxy(t, Config{EPPAddress: epps[0].addr, EPPReplicas: []string{epps[1].addr, epps[2].addr},
				EPPBalance: tc.balance})
			for range tc.requests {
				if code, _, body := post(t, proxy.URL+"/v1/completions", `{"model":"m","prompt":"hi"}`); code != http.StatusOK {
					t.Fatalf("status %d, body %s", code, body)
				}
			}
			total := 0
			for i, e := range epps {
				n := len(e.exchanges())
				total += n
				switch {
				case tc.balance == BalanceRoundRobin && n != tc.requests/3:
					t.Errorf("replica %d got %d streams, want %d", i, n, tc.requests/3)
				case n == 0:
					t.Errorf("replica %d got no stream of %d", i, tc.requests)
				}
			}
			if total != tc.requests {
				t.Errorf("%d streams for %d requests", total, tc.requests)
			}
			if n, _, _ := backend.received(); n != tc.requests {
				t.Errorf("backend served %d of %d requests", n, tc.requests)
			}
		})
	}
}

// A replica that is gone (nothing listens at its address) costs the requests sent to it while its connection is
// tried; once the connection fails, streams go to the live replica only.
func TestEPPReplicasPassOverAFailingReplica(t *testing.T) {
	backend := startBackend(t, "b", nil)
	live := startFakeEPP(t, eppBehaviour{decide: routeTo(backend.addr(), nil)})
	gone := "127.0.0.1:" + strconv.Itoa(runnertest.FreePort(t))
	proxy, _ := startProxy(t, Config{EPPAddress: live.addr, EPPReplicas: []string{gone}})
	failed := 0
	for range 40 {
		if code, _, _ := post(t, proxy.URL+"/v1/completions", `{"model":"m","prompt":"hi"}`); code != http.StatusOK {
			failed++
		}
	}
	if failed > 3 {
		t.Errorf("%d of 40 requests failed: the failing replica kept getting streams", failed)
	}
	if n := len(live.exchanges()); n < 37 {
		t.Errorf("the live replica got %d of 40 streams", n)
	}
}

// TestEPPReplicasSpreadAFailingReplicasShare: with one of three replicas gone, once its connection fails the two live
// ones share the streams evenly, as Envoy's load balancer shares them among the hosts it has not ejected; neither
// gets the gone one's turns on top of its own.
func TestEPPReplicasSpreadAFailingReplicasShare(t *testing.T) {
	for _, tc := range []struct {
		balance          string
		requests, lo, hi int
	}{
		// Round-robin: each live one gets half, but for the few streams sent while the gone one's connection was
		// tried. At random: 4 standard deviations either side of half.
		{BalanceRoundRobin, 60, 26, 34},
		{BalanceRandom, 300, 115, 185},
	} {
		t.Run(tc.balance, func(t *testing.T) {
			backend := startBackend(t, "b", nil)
			live := []*fakeEPP{startFakeEPP(t, eppBehaviour{decide: routeTo(backend.addr(), nil)}),
				startFakeEPP(t, eppBehaviour{decide: routeTo(backend.addr(), nil)})}
			gone := "127.0.0.1:" + strconv.Itoa(runnertest.FreePort(t))
			proxy, _ := startProxy(t, Config{EPPAddress: live[0].addr, EPPReplicas: []string{live[1].addr, gone}, EPPBalance: tc.balance})
			for range tc.requests {
				post(t, proxy.URL+"/v1/completions", `{"model":"m","prompt":"hi"}`)
			}
			for i, e := range live {
				if n := len(e.exchanges()); n < tc.lo || n > tc.hi {
					t.Errorf("live replica %d got %d of %d streams, want %d-%d (an even share)", i, n, tc.requests, tc.lo, tc.hi)
				}
			}
		})
	}
}

// TestEPPReplicasPanicMode: with two of three replicas gone, fewer than half are live, and streams go to all three
// in turn, as Envoy's panic mode sends them to every host: the gone ones' fail.
func TestEPPReplicasPanicMode(t *testing.T) {
	backend := startBackend(t, "b", nil)
	live := startFakeEPP(t, eppBehaviour{decide: routeTo(backend.addr(), nil)})
	gone := []string{"127.0.0.1:" + strconv.Itoa(runnertest.FreePort(t)), "127.0.0.1:" + strconv.Itoa(runnertest.FreePort(t))}
	proxy, _ := startProxy(t, Config{EPPAddress: live.addr, EPPReplicas: gone})
	for range 60 {
		post(t, proxy.URL+"/v1/completions", `{"model":"m","prompt":"hi"}`)
	}
	if n := len(live.exchanges()); n < 18 || n > 24 {
		t.Errorf("the live replica got %d of 60 streams, want a third (20, but for the first turns)", n)
	}
}
