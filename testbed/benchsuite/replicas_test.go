package benchsuite

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
	"time"
)

const replicasScenario = minimalScenario + `replicas:
  counts: [2, 4]
  balance: [round-robin, random]
  sharing: [none, endpoint-ownership]
  targets:
    - {figure: ttft_p99, class: chat, vs: sluice, at_most: 1.1}
    - {figure: shed_without_retry_after, at_most: 0}
`

func TestReplicasAddContendersAndTargets(t *testing.T) {
	sc, err := ParseScenario([]byte(replicasScenario), "/x/rep")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range sc.Contenders {
		names = append(names, c.Name)
		if c.Replicas > 1 && (!c.SluiceAdmission || c.Router != RouterEPP || !strings.HasPrefix(c.Describe(), "2 replicas") && !strings.HasPrefix(c.Describe(), "4 replicas")) {
			t.Errorf("%s: %+v (%s), want the sluice contender replicated", c.Name, c, c.Describe())
		}
	}
	want := "round-robin,upstream-default,sluice,sluice-x2-round-robin,sluice-x2-random,sluice-x2-round-robin-owned," +
		"sluice-x2-random-owned,sluice-x4-round-robin,sluice-x4-random,sluice-x4-round-robin-owned,sluice-x4-random-owned"
	if got := strings.Join(names, ","); got != want {
		t.Errorf("contenders %s, want %s", got, want)
	}
	c, _ := sc.Contender("sluice-x4-random-owned")
	if c.Replicas != 4 || c.Balance != "random" || !c.EndpointOwnership {
		t.Errorf("sluice-x4-random-owned: %d replicas balanced %q, ownership %v", c.Replicas, c.Balance, c.EndpointOwnership)
	}
	cfg, err := VirtualConfig(sc, c)
	if err != nil || cfg.Router.Replicas != 4 || cfg.Router.Balance != "random" || !cfg.Router.Ownership || cfg.Router.Admission == nil ||
		cfg.Router.PeerExchange {
		t.Errorf("virtual config %+v, %v: want 4 owning replicas balanced at random with Sluice admission", cfg.Router, err)
	}
	exchange, err := ParseScenario([]byte(strings.Replace(replicasScenario, "sharing: [none, endpoint-ownership]",
		"sharing: [peer-exchange]", 1)), "/x/rep")
	if err != nil {
		t.Fatal(err)
	}
	c, _ = exchange.Contender("sluice-x2-round-robin-exchange")
	if cfg, err := VirtualConfig(exchange, c); err != nil || !cfg.Router.Ownership || !cfg.Router.PeerExchange {
		t.Errorf("sluice-x2-round-robin-exchange: virtual config %+v, %v: want ownership and the peer exchange", cfg.Router, err)
	}
	declared := sc.Targets[:len(sc.Targets)-1]
	if len(declared) != 16 {
		t.Fatalf("targets %v, want 2 for each of 8 replicated runs", declared)
	}
	if d := declared[0]; d.Subject != "sluice-x2-round-robin" || d.Versus != Sluice || d.Class != "chat" || d.Bound != 1.1 {
		t.Errorf("first target %+v", d)
	}
	if d := declared[15]; d.Subject != "sluice-x4-random-owned" || d.Versus != "" || d.Figure != FigureShedWithoutRetryAfter {
		t.Errorf("last target %+v", d)
	}
}

func TestReplicasErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"no counts", minimalScenario + "replicas: {balance: [random]}\n", []string{"replicas.counts: required"}},
		{"one replica", minimalScenario + "replicas: {counts: [1]}\n", []string{"replicas.counts[0]", "2..64"}},
		{"twice", minimalScenario + "replicas: {counts: [2, 2]}\n", []string{"replicas.counts[1]", "given once"}},
		{"too many", minimalScenario + "replicas: {counts: [65]}\n", []string{"replicas.counts[0]"}},
		{"sharing", minimalScenario + "replicas: {counts: [2], sharing: [gossip]}\n", []string{"replicas.sharing[0]", `"gossip"`}},
		{"balance", minimalScenario + "replicas: {counts: [2], balance: [least-request]}\n", []string{"replicas.balance[0]", `"least-request"`}},
		{"vs", minimalScenario + "replicas: {counts: [2], targets: [{figure: ttft_p99, vs: round-robin, at_most: 1}]}\n",
			[]string{"replicas.targets[0].vs", "one-replica run"}},
		{"bad target", minimalScenario + "replicas: {counts: [2], targets: [{figure: ttft_p98, vs: sluice, at_most: 1}]}\n",
			[]string{"replicas.targets[0].figure", `"ttft_p98"`}},
		{"hit rate per class", minimalScenario + "replicas: {counts: [2], targets: [{figure: prefix_hit_rate, class: chat, vs: sluice, at_least: 1}]}\n",
			[]string{"replicas.targets[0]", "the fleet's"}},
	} {
		_, err := ParseScenario([]byte(tc.file), "/x/rep")
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %v, want %q", tc.name, err, w)
			}
		}
	}
}

// The replicated runs are judged against the one-replica run, and the report's table holds their ratios.
func TestReplicasAgainstOneReplica(t *testing.T) {
	sc, err := ParseScenario([]byte(replicasScenario), "/x/rep")
	if err != nil {
		t.Fatal(err)
	}
	res := ScenarioResult{Scenario: sc}
	ttft := map[string][]int{
		Sluice: {100, 100, 100, 200}, "sluice-x2-round-robin": {100, 100, 100, 210}, "sluice-x2-random": {100, 100, 100, 400},
		"sluice-x4-round-robin": {100, 100, 100, 220},
	}
	for _, c := range sc.Contenders {
		run := ContenderRun{Contender: c}
		if ms, ok := ttft[c.Name]; ok {
			run.Result = fakeRun("rep", c.Name, fakeRequests{class: "chat", ttft: msOf(ms)})
		} else if c.Replicas > 1 {
			run.Error = "epp exited"
		}
		res.Runs = append(res.Runs, run)
	}
	res.Result("sluice-x4-round-robin").Fleet.PrefixHitTokens = 20 // 20% against 25%
	met := map[string]bool{}
	for _, tr := range res.EvaluateTargets() {
		if tr.Target.Figure == FigureTTFTP99 {
			met[tr.Target.Subject] = tr.Met
		}
	}
	// TTFT P99s against sluice's: 1.05x, 1.98x, 1.1x, and a failed run is not met.
	if !met["sluice-x2-round-robin"] || met["sluice-x2-random"] || !met["sluice-x4-round-robin"] || met["sluice-x4-random"] ||
		met["sluice-x2-round-robin-owned"] {
		t.Errorf("TTFT P99 targets met: %v", met)
	}
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	writeReplicas(w, &res)
	_ = w.Flush()
	report := buf.String()
	for _, want := range []string{
		"| sluice-x2-random | 1.00x (+0%) | 1.98x (+98%) | 1.98x (+98%) | 1.00x (+0%) | 1.00x (+0%) | 0 (0) |",
		"| sluice-x4-round-robin | 1.00x (+0%) | 1.10x (+10%) | 1.10x (+10%) | 1.00x (+0%) | 0.80x (-20%) |",
		"| sluice-x4-random | no run: the sluice-x4-random run failed |",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
}

// TestReplicasAdapterLoads: with LoRA adapters in the mix, the comparison with one replica adds the fleet's adapter
// loads as a ratio; without, it has no such column.
func TestReplicasAdapterLoads(t *testing.T) {
	for _, tt := range []struct {
		name, adapters string
		want, lacks    string
	}{
		{"adapters", "adapters: {count: 4, zipf_s: 1.0, share: 0.5}\n",
			"| Prefix hit rate | Adapter loads | 429/503 (without Retry-After) |", ""},
		{"no adapters", "", "| Prefix hit rate | 429/503 (without Retry-After) |", "Adapter loads"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sc, err := ParseScenario([]byte(minimalScenario+tt.adapters+"replicas: {counts: [2]}\n"), "/x/rep")
			if err != nil {
				t.Fatal(err)
			}
			res := ScenarioResult{Scenario: sc}
			for _, c := range sc.Contenders {
				run := ContenderRun{Contender: c}
				if c.Name == Sluice || c.Name == "sluice-x2-round-robin" {
					run.Result = fakeRun("rep", c.Name, fakeRequests{class: "chat", ttft: msOf([]int{100, 100})})
				}
				res.Runs = append(res.Runs, run)
			}
			res.Result(Sluice).Fleet.AdapterLoads = 40
			res.Result("sluice-x2-round-robin").Fleet.AdapterLoads = 100
			var buf bytes.Buffer
			w := bufio.NewWriter(&buf)
			writeReplicas(w, &res)
			_ = w.Flush()
			report := buf.String()
			if !strings.Contains(report, tt.want) {
				t.Errorf("report lacks %q:\n%s", tt.want, report)
			}
			withAdapters := tt.adapters != ""
			if row := "| 1.00x (+0%) | 2.50x (+150%) | 0 (0) |"; strings.Contains(report, row) != withAdapters {
				t.Errorf("report has the adapter loads' ratio %q: %v, want %v:\n%s", row, !withAdapters, withAdapters, report)
			}
			if tt.lacks != "" && strings.Contains(report, tt.lacks) {
				t.Errorf("report has %q:\n%s", tt.lacks, report)
			}
		})
	}
}

func msOf(v []int) []time.Duration { return ms(v...) }
