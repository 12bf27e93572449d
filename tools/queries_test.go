package tools

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/sluice-gw/sluice/flowcontrol"
)

// query is one PromQL expression of the dashboard or of an alert, with where it is, for messages.
type query struct {
	where, expr string
	// legend is a panel target's legendFormat; its {{label}}s must be labels of the result.
	legend string
}

// grafanaVariables are the range variables the dashboard uses, replaced by a duration for parsing.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$__range", "1h")

// dashboardQueries reads dashboards/sluice.json and checks what makes it importable: the datasource variable every
// panel uses, unique panel IDs and unique refIds per panel.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	raw, err := os.ReadFile("dashboards/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr   string `json:"expr"`
			Legend string `json:"legendFormat"`
			RefID  string `json:"refId"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var dash struct {
		UID        string            `json:"uid"`
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct{ Name, Type string } `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboards/sluice.json: %v", err)
	}
	if len(dash.Templating.List) == 0 || dash.Templating.List[0].Name != "DS_PROMETHEUS" || dash.Templating.List[0].Type != "datasource" {
		t.Errorf("the dashboard must declare the datasource variable DS_PROMETHEUS, got %+v", dash.Templating.List)
	}
	var queries []query
	ids := map[int]bool{}
	var walk func([]json.RawMessage)
	walk = func(raws []json.RawMessage) {
		for _, r := range raws {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatal(err)
			}
			if ids[p.ID] {
				t.Errorf("panel id %d is used twice", p.ID)
			}
			ids[p.ID] = true
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${DS_PROMETHEUS}" || len(p.Targets) == 0 {
				t.Errorf("panel %q: want targets on datasource ${DS_PROMETHEUS}", p.Title)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if refs[tg.RefID] || tg.RefID == "" {
					t.Errorf("panel %q: refId %q empty or repeated", p.Title, tg.RefID)
				}
				refs[tg.RefID] = true
				queries = append(queries, query{where: fmt.Sprintf("panel %q %s", p.Title, tg.RefID), expr: tg.Expr, legend: tg.Legend})
			}
		}
	}
	walk(dash.Panels)
	return queries
}

// alertQueries reads alerts/sluice-alerts.yaml, a PrometheusRule, and parses its groups as Prometheus does
// (rulefmt: structure, expressions, durations, templates).
func alertQueries(t *testing.T) []query {
	t.Helper()
	raw, err := os.ReadFile("alerts/sluice-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       map[string]any `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(raw, &rule, yaml.DisallowUnknownFields); err != nil {
		t.Fatalf("alerts/sluice-alerts.yaml: %v", err)
	}
	if rule.APIVersion != "monitoring.coreos.com/v1" || rule.Kind != "PrometheusRule" {
		t.Errorf("alerts/sluice-alerts.yaml is %s %s, want monitoring.coreos.com/v1 PrometheusRule", rule.APIVersion, rule.Kind)
	}
	groups, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	parsed, errs := rulefmt.Parse(groups, false, model.UTF8Validation)
	if len(errs) > 0 {
		t.Fatalf("alerts/sluice-alerts.yaml: %v", errors.Join(errs...))
	}
	var queries []query
	for _, g := range parsed.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Labels["severity"] == "" || r.Annotations["description"] == "" {
				t.Errorf("rule %q in group %s: want an alert with a severity label and a description", r.Alert, g.Name)
			}
			queries = append(queries, query{where: "alert " + r.Alert, expr: r.Expr})
		}
	}
	if len(queries) == 0 {
		t.Fatal("alerts/sluice-alerts.yaml has no rules")
	}
	return queries
}

// closedLabelValues are the values some labels can take, from the product's enums: a query may name one that the
// test's traffic did not produce (a Critical request shed for queue_timeout).
func closedLabelValues() map[string][]string {
	var bands, reasons []string
	for _, b := range flowcontrol.AllBands() {
		bands = append(bands, b.String())
	}
	for r := flowcontrol.ReasonSaturated; r <= flowcontrol.ReasonEarlyReturn; r++ {
		reasons = append(reasons, r.String())
	}
	return map[string][]string{"band": bands, "reason": reasons}
}

// simpleAlternatives matches a regular expression that is only alternatives of plain words: a|b|c.
var simpleAlternatives = regexp.MustCompile(`^[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*$`)

// legendLabel finds the {{label}}s of a legendFormat.
var legendLabel = regexp.MustCompile(`\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)

// checkQuery parses q and reports every metric it selects that exp lacks, every label it matches, groups by or
// names in its legend that those metrics lack, and every value it matches exactly (or as one of plain
// alternatives) that neither exp nor the label's closed set has.
func checkQuery(t *testing.T, exp exposition, q query) {
	t.Helper()
	expr, err := parser.ParseExpr(grafanaVariables.Replace(q.expr))
	if err != nil {
		t.Errorf("%s: %v\n  %s", q.where, err, q.expr)
		return
	}
	closed := closedLabelValues()
	// labelsIn is the union of the labels of the metrics selected under a node.
	labelsIn := func(n parser.Node) map[string]bool {
		out := map[string]bool{}
		parser.Inspect(n, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				for l := range exp[vs.Name] {
					out[l] = true
				}
			}
			return nil
		})
		return out
	}
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			series, ok := exp[n.Name]
			if !ok {
				t.Errorf("%s: metric %s is not on /metrics", q.where, n.Name)
				return nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					continue
				}
				values, ok := series[m.Name]
				if !ok {
					t.Errorf("%s: %s has no label %q", q.where, n.Name, m.Name)
					continue
				}
				var named []string
				switch {
				case m.Type == labels.MatchEqual || m.Type == labels.MatchNotEqual:
					named = []string{m.Value}
				case simpleAlternatives.MatchString(m.Value):
					named = strings.Split(m.Value, "|")
				}
				for _, v := range named {
					if !values[v] && !slices.Contains(closed[m.Name], v) {
						t.Errorf("%s: %s{%s} never takes the value %q", q.where, n.Name, m.Name, v)
					}
				}
			}
		case *parser.AggregateExpr:
			have := labelsIn(n.Expr)
			for _, l := range n.Grouping {
				if !have[l] {
					t.Errorf("%s: groups by %q, which the metrics it aggregates do not have", q.where, l)
				}
			}
		}
		return nil
	})
	have := labelsIn(expr)
	for _, m := range legendLabel.FindAllStringSubmatch(q.legend, -1) {
		if !have[m[1]] {
			t.Errorf("%s: legend names {{%s}}, which the query's metrics do not have", q.where, m[1])
		}
	}
}

// TestDashboardAndAlertsMatchMetrics is the dashboard's and the alerts' contract with the EPP: every metric, label
// and label value they name is one the EPP exposes, with every feature on and under overload.
func TestDashboardAndAlertsMatchMetrics(t *testing.T) {
	queries := append(dashboardQueries(t), alertQueries(t)...)
	for _, q := range queries {
		if _, err := parser.ParseExpr(grafanaVariables.Replace(q.expr)); err != nil {
			t.Fatalf("%s: %v\n  %s", q.where, err, q.expr)
		}
	}
	exp := runEveryFeature(t)
	for _, q := range queries {
		checkQuery(t, exp, q)
	}
}
