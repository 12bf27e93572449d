package benchsuite

import (
	"bufio"
	"cmp"
	"fmt"
	"strings"
)

// shapeContenders are the columns of the server-shapes table.
var shapeContenders = []string{RoundRobin, UpstreamDefault, Sluice}

// writeShapes renders, for every scenario file that ran on more than one server shape in the session, one row per
// shape: its fleet and load, each contender's TTFT P99 (of the unloaded reference's class, and as a multiple of its
// unloaded value, when the scenario has one), Sluice's throughput against upstream's and the targets met. A default
// that wins on one shape and loses on another shows here.
func writeShapes(b *bufio.Writer, res *SuiteResult) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	var families []string
	members := map[string][]*ScenarioResult{}
	for i := range res.Scenarios {
		s := &res.Scenarios[i]
		f := s.Scenario.Family
		if f == "" {
			continue
		}
		if _, ok := members[f]; !ok {
			families = append(families, f)
		}
		members[f] = append(members[f], s)
	}
	header := false
	for _, f := range families {
		rows := members[f]
		if len(rows) < 2 {
			continue
		}
		if !header {
			p("\n## Server shapes\n\nScenarios run on more than one kind of model server: one row per fleet, each contender's " +
				"figure in the same run on that fleet.\n")
			header = true
		}
		unloaded := rows[0].Scenario.Unloaded
		figure := "TTFT P99"
		if unloaded != nil {
			figure = unloaded.Class + " TTFT P99 (x its unloaded value)"
		}
		p("\n### %s\n\n| Shape | Fleet | Load |", f)
		if unloaded != nil {
			p(" %s unloaded |", unloaded.Class)
		}
		for _, c := range shapeContenders {
			p(" %s: %s |", c, figure)
		}
		p(" Sluice throughput vs upstream-default | Targets met |\n|---|---|---|%s\n",
			strings.Repeat("---|", len(shapeContenders)+2+btoi(unloaded != nil)))
		for _, s := range rows {
			sc := s.Scenario
			p("| [%s](#%s) | `%s` | %s |", cmp.Or(sc.Shape, sc.Name), anchor(sc), sc.Fleet, describeLoad(sc))
			var ref FigureValues
			if unloaded != nil {
				ref, _ = s.ClassFigures(Unloaded, "")
				p(" %s |", figureCell(ref, FigureTTFTP99))
			}
			for _, c := range shapeContenders {
				class := ""
				if unloaded != nil {
					class = unloaded.Class
				}
				v, ok := s.ClassFigures(c, class)
				switch {
				case !ok:
					p(" %s |", cmp.Or(s.missing(c), "no request served"))
				case ref != nil:
					cell := figureCell(v, FigureTTFTP99)
					if r, ok := Ratio(v, ref, FigureTTFTP99); ok {
						cell += fmt.Sprintf(" (%sx)", trimRatio(r))
					}
					p(" %s |", cell)
				default:
					p(" %s |", figureCell(v, FigureTTFTP99))
				}
			}
			met := 0
			for _, t := range s.Targets {
				if t.Met {
					met++
				}
			}
			p(" %s | %d of %d |\n", ratioCell(s, UpstreamDefault, FigureThroughput), met, len(s.Targets))
		}
	}
}

// figureCell is a figure's value, or n/a.
func figureCell(v FigureValues, f Figure) string {
	if x, ok := v[f]; ok {
		return f.Format(x)
	}
	return "n/a"
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
