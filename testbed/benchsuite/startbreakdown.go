package benchsuite

import (
	"bufio"
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// StartBreakdown splits the time to first token of successful attempts into three parts, each a mean over the
// attempts: the way to the server (routing, the gateway's queue, proxies: TTFT minus the server's own time to first
// token), the wait inside the server for a place in its running batch (its queue time), and the first steps there
// (prefill, shared with the batch). Slowest repeats it over the slowest 5% of those attempts by TTFT: where a tail
// comes from. Only attempts whose server reported its times count (Record.ServerTTFT).
type StartBreakdown struct {
	Attempts     int
	All, Slowest StartParts
	// SlowestCount attempts make up Slowest; SlowestTTFTMin is the fastest of them.
	SlowestCount   int
	SlowestTTFTMin time.Duration
}

// StartParts are the mean parts of a time to first token.
type StartParts struct {
	Way, ServerQueue, FirstSteps time.Duration
}

// slowestShare is the share of attempts StartBreakdown.Slowest covers.
const slowestShare = 0.05

// ComputeStartBreakdown computes the breakdown over the successful attempts of class ("" for all) that carry the
// server's times; ok is false without any.
func ComputeStartBreakdown(records []loadgen.Record, class string) (StartBreakdown, bool) {
	var byTTFT []loadgen.Record // slowest first
	for _, r := range records {
		if r.OK() && r.ServerTTFT > 0 && r.TTFT > 0 && (class == "" || r.Class == class) {
			byTTFT = append(byTTFT, r)
		}
	}
	if len(byTTFT) == 0 {
		return StartBreakdown{}, false
	}
	slices.SortStableFunc(byTTFT, func(a, b loadgen.Record) int { return cmp.Compare(b.TTFT, a.TTFT) })
	bd := StartBreakdown{Attempts: len(byTTFT), SlowestCount: max(1, int(float64(len(byTTFT))*slowestShare))}
	bd.All = meanParts(byTTFT)
	bd.Slowest = meanParts(byTTFT[:bd.SlowestCount])
	bd.SlowestTTFTMin = byTTFT[bd.SlowestCount-1].TTFT
	return bd, true
}

func meanParts(recs []loadgen.Record) StartParts {
	var way, queue, steps time.Duration
	for _, r := range recs {
		way += max(0, r.TTFT-r.ServerTTFT)
		queue += r.ServerQueue
		steps += r.ServerTTFT - r.ServerQueue
	}
	n := time.Duration(len(recs))
	return StartParts{Way: way / n, ServerQueue: queue / n, FirstSteps: steps / n}
}

func (p StartParts) String() string {
	return fmt.Sprintf("%s + %s + %s", formatSeconds(p.Way.Seconds()), formatSeconds(p.ServerQueue.Seconds()),
		formatSeconds(p.FirstSteps.Seconds()))
}

// writeStartBreakdown tabulates StartBreakdown per class and contender, when the servers reported their times.
func writeStartBreakdown(b *bufio.Writer, s *ScenarioResult) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	classes := []string{""}
	if n := len(s.Scenario.Mix.Classes); n > 1 && n <= maxClassRows {
		for _, c := range s.Scenario.Mix.Classes {
			classes = append(classes, c.Name)
		}
	}
	type cell struct {
		bd StartBreakdown
		ok bool
	}
	cells := map[string]map[string]cell{}
	found := false
	for _, run := range s.Runs {
		if run.Result == nil {
			continue
		}
		cells[run.Contender.Name] = map[string]cell{}
		for _, c := range classes {
			bd, ok := ComputeStartBreakdown(run.Result.Records, c)
			cells[run.Contender.Name][c] = cell{bd, ok}
			found = found || ok
		}
	}
	if !found {
		return
	}
	p("\nWhere the time to first token went, mean over successful attempts: the way to the server (routing, the EPP's " +
		"queue, proxies) + the wait inside the server for a place in its batch + its first steps (prefill); then the " +
		"same over the slowest 5%% by TTFT (at least one), from the servers' own x-sim-* times:\n\n| Class | |")
	for _, run := range s.Runs {
		p(" %s |", run.Contender.Name)
	}
	p("\n|---|---|%s\n", strings.Repeat("---|", len(s.Runs)))
	for _, c := range classes {
		for _, slow := range []bool{false, true} {
			label, which := cmp.Or(c, "all"), "all"
			if slow {
				label, which = "", "slowest 5%"
			}
			p("| %s | %s |", label, which)
			for _, run := range s.Runs {
				x, ok := cells[run.Contender.Name][c]
				switch {
				case !ok || !x.ok:
					p(" – |")
				case slow:
					p(" %s (TTFT ≥ %s) |", x.bd.Slowest, formatSeconds(x.bd.SlowestTTFTMin.Seconds()))
				default:
					p(" %s |", x.bd.All)
				}
			}
			p("\n")
		}
	}
}
