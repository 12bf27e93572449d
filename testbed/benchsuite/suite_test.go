package benchsuite

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// scriptedEngine answers runs from a table: a contender named in fail
// fails, cancelAfter cancels the suite's context when that many runs have
// started.
type scriptedEngine struct {
	fail        map[string]bool
	skip        map[string]bool
	cancelAfter int
	cancel      context.CancelFunc
	calls       []string
}

func (e *scriptedEngine) Run(ctx context.Context, sc *Scenario, c Contender) (*RunResult, error) {
	e.calls = append(e.calls, sc.Name+"/"+c.Name)
	if e.cancelAfter > 0 && len(e.calls) == e.cancelAfter {
		e.cancel()
		return nil, ctx.Err()
	}
	if e.fail[c.Name] {
		return nil, errors.New("the " + c.Name + " binary crashed")
	}
	if e.skip[c.Name] {
		return nil, &SkippedError{Reason: c.Name + " cannot run here"}
	}
	return fakeRun(sc.Name, c.Name, fakeRequests{class: "chat", ttft: ms(10, 20)}), nil
}

// recordingProgress keeps what Suite told it.
type recordingProgress struct{ events []string }

func (p *recordingProgress) StartRun(index, total int, sc *Scenario, c Contender) {
	p.events = append(p.events, "start "+sc.Name+"/"+c.Name)
}

func (p *recordingProgress) EndRun(res *RunResult, err error) {
	if err != nil {
		p.events = append(p.events, "failed")
		return
	}
	p.events = append(p.events, "ok "+res.Scenario+"/"+res.Contender)
}

func twoScenarios(t *testing.T) []*Scenario {
	t.Helper()
	var out []*Scenario
	for _, name := range []string{"one", "two"} {
		sc, err := ParseScenario([]byte(minimalScenario), "/x/"+name)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, sc)
	}
	return out
}

func TestSuiteRun(t *testing.T) {
	dir := t.TempDir()
	engine := &scriptedEngine{fail: map[string]bool{UpstreamDefault: true}}
	progress := &recordingProgress{}
	suite := &Suite{Engine: engine, EngineName: "scripted", OutDir: dir, Progress: progress}
	res, err := suite.Run(t.Context(), twoScenarios(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(engine.calls, " "); got != "one/round-robin one/upstream-default one/sluice two/round-robin two/upstream-default two/sluice" {
		t.Errorf("runs %s", got)
	}
	if got := strings.Join(progress.events, ", "); got != "start one/round-robin, ok one/round-robin, start one/upstream-default, failed, "+
		"start one/sluice, ok one/sluice, start two/round-robin, ok two/round-robin, start two/upstream-default, failed, start two/sluice, ok two/sluice" {
		t.Errorf("progress %s", got)
	}
	if len(res.Scenarios) != 2 || res.Engine != "scripted" || !res.Failed() {
		t.Fatalf("result %+v", res)
	}
	one := res.Scenarios[0]
	if one.Runs[1].Result != nil || !strings.Contains(one.Runs[1].Error, "crashed") || one.Runs[2].Result == nil {
		t.Errorf("runs %+v", one.Runs)
	}
	if len(one.Targets) != 1 || one.Targets[0].Met {
		t.Errorf("targets against a failed baseline: %+v", one.Targets)
	}
	for _, p := range []string{"one/round-robin/run.json", "two/sluice/run.json"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "one/upstream-default/run.json")); err == nil {
		t.Error("a failed run has a run.json")
	}
}

func TestSuiteRunSkipped(t *testing.T) {
	dir := t.TempDir()
	suite := &Suite{Engine: &scriptedEngine{skip: map[string]bool{UpstreamDefault: true}}, OutDir: dir}
	res, err := suite.Run(t.Context(), twoScenarios(t)[:1])
	if err != nil {
		t.Fatal(err)
	}
	run := res.Scenarios[0].Runs[1]
	if run.Skipped != "upstream-default cannot run here" || run.Error != "" || run.Result != nil {
		t.Errorf("skipped run %+v", run)
	}
	if res.Failed() {
		t.Error("a skipped run counts as a failure")
	}
	if _, err := os.Stat(filepath.Join(dir, "one/upstream-default/run.json")); err == nil {
		t.Error("a skipped run has a run.json")
	}
	var buf bytes.Buffer
	if err := WriteReport(&buf, res, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| upstream-default | EPP, upstream v1.5.0 default profile, upstream admission | skipped: upstream-default cannot run here |",
		"no figures: the upstream-default run was skipped",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, buf.String())
		}
	}
	if sum := Summarize(res); sum.Scenarios[0].Contenders[1].Skipped == "" {
		t.Errorf("results.json loses the skip: %+v", sum.Scenarios[0].Contenders[1])
	}
}

func TestSuiteRunInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	engine := &scriptedEngine{cancelAfter: 5, cancel: cancel}
	suite := &Suite{Engine: engine, OutDir: t.TempDir()}
	res, err := suite.Run(ctx, twoScenarios(t))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want the context's", err)
	}
	if len(engine.calls) != 5 {
		t.Errorf("%d runs started after cancelling at the fifth", len(engine.calls))
	}
	// The first scenario is complete; the second keeps its one finished run.
	if len(res.Scenarios) != 2 || len(res.Scenarios[0].Runs) != 3 || len(res.Scenarios[1].Runs) != 1 {
		t.Fatalf("scenarios %+v", res.Scenarios)
	}
	var buf bytes.Buffer
	if err := WriteHeadline(&buf, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "no figures: the sluice run did not happen (interrupted)") {
		t.Errorf("headline of an interrupted session:\n%s", buf.String())
	}
}

func TestProgressBarLines(t *testing.T) {
	scs := twoScenarios(t)
	var buf bytes.Buffer
	bar := NewProgressBar(&buf, false, scs)
	if want := 6 * planOf(scs[0]); PlannedDuration(scs) != want {
		t.Errorf("planned %v, want %v", PlannedDuration(scs), want)
	}
	together := *scs[1]
	together.Interleave = true
	if want := 4 * planOf(scs[0]); PlannedDuration([]*Scenario{scs[0], &together}) != want {
		t.Errorf("planned %v with the second scenario interleaved, want %v", PlannedDuration([]*Scenario{scs[0], &together}), want)
	}
	c, _ := scs[0].Contender(Sluice)
	bar.StartRun(2, 6, scs[0], c)
	bar.Record(loadgen.Record{Final: true, Status: 200})
	run := fakeRun("one", Sluice, fakeRequests{class: "chat", ttft: ms(10, 20)})
	run.Wall = 41 * time.Second
	bar.EndRun(run, nil)
	bar.StartRun(3, 6, scs[1], c)
	bar.EndRun(nil, errors.New("boom"))
	bar.StartRun(4, 6, scs[1], c)
	bar.EndRun(nil, &SkippedError{Reason: "not here"})
	bar.StartRun(5, 6, scs[1], c)
	run.Virtual, run.Wall = 31*time.Second, 420*time.Millisecond
	bar.EndRun(run, nil)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		"[3/6] one · sluice: EPP, Sluice default profile, Sluice admission (default policy), 30s of load",
		"[3/6] one · sluice: 2 requests, 2 ok, TTFT p99 20 ms, 0.20 req/s, 41s",
		"[4/6] two · sluice: EPP, Sluice default profile, Sluice admission (default policy), 30s of load",
		"[4/6] two · sluice: FAILED: boom",
		"[5/6] two · sluice: EPP, Sluice default profile, Sluice admission (default policy), 30s of load",
		"[5/6] two · sluice: skipped: not here",
		"[6/6] two · sluice: EPP, Sluice default profile, Sluice admission (default policy), 30s of load",
		"[6/6] two · sluice: 2 requests, 2 ok, TTFT p99 20 ms, 0.20 req/s, 31s virtual in 420ms",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("progress lines:\n%s\nwant:\n%s", buf.String(), strings.Join(want, "\n"))
	}
}

// interleavingEngine is a scriptedEngine that also runs contenders in one
// load, recording each group.
type interleavingEngine struct {
	scriptedEngine
	groups []string
}

func (e *interleavingEngine) RunInterleaved(ctx context.Context, sc *Scenario, cs []Contender) ([]*RunResult, error) {
	var names []string
	var out []*RunResult
	for _, c := range cs {
		names = append(names, c.Name)
		out = append(out, fakeRun(sc.Name, c.Name, fakeRequests{class: "chat", ttft: ms(10, 20)}))
	}
	e.groups = append(e.groups, sc.Name+":"+strings.Join(names, ","))
	if e.fail[cs[0].Name] {
		return nil, errors.New("the first fleet did not start")
	}
	return out, nil
}

// TestSuiteInterleaves: a scenario with interleave runs its contenders in
// one load through an engine that can, but the unloaded reference on its
// own; without the option, or with an engine that cannot, one after another.
func TestSuiteInterleaves(t *testing.T) {
	parse := func(name, extra string) *Scenario {
		sc, err := ParseScenario([]byte(minimalScenario+extra), "/x/"+name)
		if err != nil {
			t.Fatal(err)
		}
		return sc
	}
	scenarios := func() []*Scenario {
		return []*Scenario{
			parse("together", "interleave: true\nunloaded: {class: chat, rate: 1}\n"),
			parse("apart", ""),
		}
	}
	for _, tc := range []struct {
		name       string
		engine     Engine
		fail       bool
		wantGroups string
		wantRuns   string
	}{
		{"interleaving engine", &interleavingEngine{}, false,
			"together:round-robin,upstream-default,sluice",
			"together/unloaded apart/round-robin apart/upstream-default apart/sluice"},
		{"interleaved load fails", &interleavingEngine{scriptedEngine: scriptedEngine{fail: map[string]bool{RoundRobin: true}}}, true,
			"together:round-robin,upstream-default,sluice",
			"together/unloaded apart/round-robin apart/upstream-default apart/sluice"},
		{"engine that cannot", &scriptedEngine{}, false, "",
			"together/round-robin together/upstream-default together/sluice together/unloaded apart/round-robin apart/upstream-default apart/sluice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := (&Suite{Engine: tc.engine, EngineName: "scripted"}).Run(t.Context(), scenarios())
			if err != nil {
				t.Fatal(err)
			}
			var calls []string
			var groups string
			switch e := tc.engine.(type) {
			case *interleavingEngine:
				calls, groups = e.calls, strings.Join(e.groups, " ")
			case *scriptedEngine:
				calls = e.calls
			}
			if groups != tc.wantGroups {
				t.Errorf("interleaved loads %q, want %q", groups, tc.wantGroups)
			}
			if got := strings.Join(calls, " "); got != tc.wantRuns {
				t.Errorf("runs %q, want %q", got, tc.wantRuns)
			}
			together := res.Scenarios[0]
			if len(together.Runs) != 4 {
				t.Fatalf("%d runs, want 4", len(together.Runs))
			}
			for _, run := range together.Runs {
				failed := run.Result == nil
				if want := tc.fail && !run.Contender.Unloaded; failed != want {
					t.Errorf("%s: failed %v (%s), want %v", run.Contender.Name, failed, run.Error, want)
				}
			}
		})
	}
}
