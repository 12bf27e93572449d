package virtualbench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

func replicated(router Router, n int, balance Balance) Router {
	router.Replicas, router.Balance = n, balance
	return router
}

// Every replica gets streams, by the policy's rule, and every request still ends in exactly one final record with
// nothing left in any replica.
func TestReplicasShareTheStreams(t *testing.T) {
	for _, tc := range []struct {
		name    string
		router  Router
		balance Balance
	}{
		{"sluice round-robin", SluiceRouter(nil, nil), BalanceRoundRobin},
		{"sluice random", SluiceRouter(nil, nil), BalanceRandom},
		{"upstream round-robin", UpstreamRouter(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := busyConfig(t, replicated(tc.router, 3, tc.balance))
			cfg.Arrival.Rate = 120 // overload: queues, sheds and retries on every replica
			res, err := Run(cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkNothingLost(t, res.Records)
			if len(res.ReplicaRequests) != 3 {
				t.Fatalf("replica requests %v, want 3 replicas", res.ReplicaRequests)
			}
			total, lo, hi := 0, res.ReplicaRequests[0], res.ReplicaRequests[0]
			for _, n := range res.ReplicaRequests {
				total, lo, hi = total+n, min(lo, n), max(hi, n)
			}
			if total != len(res.Records) || total != res.EPP.Requests {
				t.Fatalf("replicas received %d streams, the run has %d attempts (%d routed)", total, len(res.Records), res.EPP.Requests)
			}
			switch tc.balance {
			case BalanceRandom:
				// 3 of ~500 streams each: every replica gets some, and random is not a rotation.
				if lo == 0 || hi-lo <= 1 {
					t.Fatalf("random balance gave %v", res.ReplicaRequests)
				}
			default:
				if hi-lo > 1 {
					t.Fatalf("round-robin gave %v, want shares within one stream", res.ReplicaRequests)
				}
			}
		})
	}
}

// One replica is the run without replicas: replica 0 keeps the run's seed.
func TestOneReplicaIsTheSingleEPP(t *testing.T) {
	encode := func(router Router) []byte {
		res, err := Run(busyConfig(t, router))
		if err != nil {
			t.Fatal(err)
		}
		out, err := json.Marshal(res.Records)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	single := encode(SluiceRouter(nil, nil))
	if one := encode(replicated(SluiceRouter(nil, nil), 1, BalanceRandom)); !bytes.Equal(single, one) {
		t.Fatal("one replica routed differently from the EPP without replicas")
	}
	if two := encode(replicated(SluiceRouter(nil, nil), 2, BalanceRoundRobin)); bytes.Equal(single, two) {
		t.Fatal("two independent replicas routed exactly as one EPP: the replicas are not independent")
	}
}

func TestReplicaConfigErrors(t *testing.T) {
	mix := mustMix(t, busyMix)
	base := Config{Fleet: "h100:1", Mix: mix, Duration: time.Second, Arrival: loadgen.ArrivalConfig{Kind: "poisson", Rate: 1}}
	for _, tc := range []struct {
		name   string
		router Router
		want   string
	}{
		{"round-robin replicas", replicated(RoundRobinRouter(), 2, ""), "replicas apply to the EPP router"},
		{"negative", replicated(SluiceRouter(nil, nil), -1, ""), "replicas must be 1..64"},
		{"too many", replicated(SluiceRouter(nil, nil), 65, ""), "replicas must be 1..64"},
		{"unknown balance", replicated(SluiceRouter(nil, nil), 2, "least-request"), `balance "least-request" is not round-robin or random`},
		{"ownership alone", Router{Kind: EPP, Ownership: true}, "endpoint ownership needs at least 2 replicas"},
	} {
		cfg := base
		cfg.Router = tc.router
		_, err := Run(cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

// With ownership the replicas split the fleet while they hear each other: each server belongs to exactly one, and
// every replica has some.
func TestReplicaViewsPartitionTheFleet(t *testing.T) {
	pods := make([]string, 12)
	for i := range pods {
		pods[i] = fmt.Sprintf("pod-%d", i)
	}
	now := time.Unix(0, 0)
	for _, n := range []int{2, 3, 4} {
		views, heartbeat := replicaViews(n)
		heartbeat(now)
		owner := map[string]int{}
		for k, v := range views {
			owned := v.Owned(pods, now)
			if len(owned) == 0 || len(owned) == len(pods) {
				t.Fatalf("%d replicas: replica %d owns %d of %d servers", n, k, len(owned), len(pods))
			}
			for _, p := range owned {
				if prev, dup := owner[p]; dup {
					t.Fatalf("%d replicas: %s owned by %d and %d", n, p, prev, k)
				}
				owner[p] = k
			}
		}
		if len(owner) != len(pods) {
			t.Fatalf("%d replicas own %d of %d servers", n, len(owner), len(pods))
		}
	}
	for k, servers := range replicaServers(pods, 3) {
		if len(servers) != len(pods) {
			t.Fatalf("replica %d knows %d of %d servers", k, len(servers), len(pods))
		}
	}
}

// Owning replicas (each routes by its own endpoint indexes, mapped to its servers) answer every request once.
func TestOwnershipRoutesToOwnServers(t *testing.T) {
	router := replicated(SluiceRouter(nil, nil), 2, BalanceRoundRobin)
	router.Ownership = true
	for _, fleet := range []string{"h100:2,a10g:4", "a10g:1"} { // with one server, a replica owns none: it shares it
		cfg := busyConfig(t, router)
		cfg.Fleet = fleet
		res, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		checkNothingLost(t, res.Records)
		if res.Summary.Overall.Succeeded == 0 {
			t.Fatalf("%s: nothing served", fleet)
		}
	}
}
