package runner_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// TestReplicasShareEndpoints runs two EPP binaries as replicas of one pool in static mode (--peers): while both live
// each routes only to its own half of the endpoints, the halves disjoint and covering the fleet; when one is killed
// the survivor routes to every endpoint, deciding alone, and when it is back they split the fleet again.
func TestReplicasShareEndpoints(t *testing.T) {
	port := runnertest.FreePort(t)
	var fleet []string
	for i := 2; i <= 5; i++ {
		fleet = append(fleet, runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.%d:%d", i, port)).Addr)
	}
	healthA, healthB := runnertest.FreePort(t), runnertest.FreePort(t)
	peers := fmt.Sprintf("--peers=127.0.0.1:%d,127.0.0.1:%d", healthA, healthB)
	start := func(health int) *runnertest.Process {
		return runnertest.StartEPP(t, nil, "--static-endpoints="+strings.Join(fleet, ","), "--secure-serving=false",
			"--sluice-admission", peers, fmt.Sprintf("--grpc-health-port=%d", health))
	}
	a, b := start(healthA), start(healthB)
	routed := func(p *runnertest.Process) []string {
		return slices.Sorted(maps.Keys(destinations(t, p.GRPCPort, false, 24, nil)))
	}
	split := func() string {
		ownA, ownB := routed(a), routed(b)
		if len(ownA) != 2 || len(ownB) != 2 {
			return fmt.Sprintf("replicas route to %v and %v, want two endpoints each", ownA, ownB)
		}
		if all := slices.Sorted(slices.Values(append(ownA, ownB...))); !slices.Equal(all, slices.Sorted(slices.Values(fleet))) {
			return fmt.Sprintf("replicas route to %v and %v: not a split of %v", ownA, ownB, fleet)
		}
		return ""
	}
	runnertest.Eventually(t, "two live replicas split the fleet", split)

	b.Kill()
	runnertest.Eventually(t, "the survivor routes to the whole fleet", func() string {
		if got := routed(a); len(got) != len(fleet) {
			return fmt.Sprintf("survivor routes to %v, want all of %v", got, fleet)
		}
		return ""
	})
	b = b.Restart(t)
	runnertest.Eventually(t, "the restarted replica takes its half back", split)
}
