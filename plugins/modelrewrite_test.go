package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	k8stypes "k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/sluice-gw/sluice/modelrewrite"
)

var (
	rwPool = modelrewrite.PoolKey{Namespace: "default", Group: modelrewrite.DefaultPoolGroup, Name: "vllm"}
	rwT0   = time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
)

// canaryTable: "llama" is split 1:1 between llama-v1 (stable: first of equal
// weights) and llama-v2.
func canaryTable(t *testing.T) *modelrewrite.Table {
	t.Helper()
	table, err := modelrewrite.NewTable([]modelrewrite.Rewrite{{
		Key: modelrewrite.ObjectKey{Namespace: "default", Name: "canary"}, Created: rwT0, Pool: rwPool,
		Rules: []modelrewrite.Rule{{Models: []string{"llama"}, Targets: []modelrewrite.Target{{Model: "llama-v1", Weight: 1}, {Model: "llama-v2", Weight: 1}}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// countingRecorder counts decisions and outcomes by kind and target.
type countingRecorder struct {
	modelrewrite.NopRecorder
	decisions map[string]int
	outcomes  map[string]int
}

func newCountingRecorder() *countingRecorder {
	return &countingRecorder{decisions: map[string]int{}, outcomes: map[string]int{}}
}

func (c *countingRecorder) RecordDecision(d modelrewrite.Decision) {
	c.decisions[d.Kind.String()]++
}

func (c *countingRecorder) RecordOutcome(d modelrewrite.Decision, ttft time.Duration, failed bool) {
	c.outcomes[fmt.Sprintf("%s failed=%v ttft=%v", d.Model, failed, ttft)]++
}

func newTestModelRewrite(t *testing.T, cfg ModelRewriteConfig) *ModelRewrite {
	t.Helper()
	cfg.Pool = rwPool
	m, err := NewModelRewrite(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.SetTable(canaryTable(t))
	return m
}

func TestModelRewriteChoose(t *testing.T) {
	rec := newCountingRecorder()
	m := newTestModelRewrite(t, ModelRewriteConfig{Recorder: rec, Rand: rand.NewPCG(1, 2)})
	tests := []struct {
		name      string
		headers   map[string]string
		body      string
		rewritten bool
		kind      modelrewrite.DecisionKind
	}{
		{"session header", map[string]string{"x-session-id": "s1"}, `{"model":"llama","prompt":"hi"}`, true, modelrewrite.KindSticky},
		{"user field", nil, `{"model":"llama","user":"u1","messages":[]}`, true, modelrewrite.KindSticky},
		{"no session", nil, `{"model":"llama"}`, true, modelrewrite.KindWeighted},
		{"non-string user is no session", nil, `{"model":"llama","user":7}`, true, modelrewrite.KindWeighted},
		{"no rule for the model", nil, `{"model":"mistral"}`, false, modelrewrite.KindNoMatch},
		{"model not a string is left to upstream", nil, `{"model":7}`, false, 0},
		{"no model is left to upstream", nil, `{"prompt":"x"}`, false, 0},
		{"not JSON is left to upstream", nil, `model=llama`, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, rewritten := m.Choose(tt.headers, []byte(tt.body))
			if rewritten != tt.rewritten || (tt.rewritten || tt.kind != 0) && d.Kind != tt.kind {
				t.Fatalf("decision %+v rewritten=%v, want kind %v rewritten=%v", d, rewritten, tt.kind, tt.rewritten)
			}
			if rewritten && d.Model != "llama-v1" && d.Model != "llama-v2" {
				t.Fatalf("rewritten to %q", d.Model)
			}
		})
	}
	// Decisions are counted for bodies that name a model.
	if rec.decisions["sticky"] != 2 || rec.decisions["weighted"] != 2 || rec.decisions["no_match"] != 1 {
		t.Fatalf("recorded %v", rec.decisions)
	}

	// Sticky: a session key always gets the same target, and both targets
	// get sessions; the header wins over the user field.
	seen := map[string]bool{}
	for i := range 64 {
		key := fmt.Sprintf("session-%d", i)
		first, _ := m.Choose(map[string]string{"x-session-id": key}, []byte(`{"model":"llama","user":"someone-else"}`))
		again, _ := m.Choose(nil, []byte(`{"model":"llama","user":"`+key+`"}`))
		if first.Model != again.Model {
			t.Fatalf("session %s went to %s by header and %s by user field", key, first.Model, again.Model)
		}
		seen[first.Model] = true
	}
	if len(seen) != 2 {
		t.Fatalf("64 sessions went to %v only", seen)
	}
}

func TestModelRewriteWithoutRulesReadsNoBody(t *testing.T) {
	rec := newCountingRecorder()
	m, err := NewModelRewrite(ModelRewriteConfig{Pool: rwPool, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	if d, rewritten := m.Choose(nil, []byte(`{"model":"llama"}`)); rewritten || d != (modelrewrite.Decision{}) || len(rec.decisions) != 0 {
		t.Fatalf("without a table: %+v %v, recorded %v", d, rewritten, rec.decisions)
	}
}

func TestRequestOutcomeFailed(t *testing.T) {
	tests := []struct {
		o    RequestOutcome
		want bool
	}{
		{RequestOutcome{Status: 200, Complete: true}, false},
		{RequestOutcome{Status: 204, Complete: true}, false},
		{RequestOutcome{Status: 200}, true}, // cut before its end
		{RequestOutcome{Status: 404, Complete: true}, true},
		{RequestOutcome{Status: 500, Complete: true}, true},
		{RequestOutcome{}, true}, // no response at all
	}
	for _, tt := range tests {
		if got := tt.o.Failed(); got != tt.want {
			t.Errorf("%+v: Failed() = %v, want %v", tt.o, got, tt.want)
		}
	}
}

// TestModelRewriteGuardrail drives the guardrail through the adapter: failed
// canary outcomes trip it, canary sessions are diverted to the stable target,
// answers the EPP gave itself do not count, and a changed clear token gives
// the share back.
func TestModelRewriteGuardrail(t *testing.T) {
	clk := clocktesting.NewFakeClock(rwT0)
	g, err := modelrewrite.NewGuardrail(modelrewrite.GuardrailConfig{MinRequests: 5})
	if err != nil {
		t.Fatal(err)
	}
	rec := newCountingRecorder()
	m := newTestModelRewrite(t, ModelRewriteConfig{Guardrail: g, Recorder: rec, Clock: clk})
	canaryKeys := map[string]bool{}
	choose := func(key string) modelrewrite.Decision {
		d, rewritten := m.Choose(map[string]string{"x-session-id": key}, []byte(`{"model":"llama"}`))
		if !rewritten {
			t.Fatalf("session %s not rewritten", key)
		}
		return d
	}
	for i := 0; i < 40; i++ {
		key := fmt.Sprintf("k%d", i)
		d := choose(key)
		clk.Step(time.Second)
		if d.Model == "llama-v2" {
			canaryKeys[key] = true
			// The EPP's own rejections are not the model's errors.
			m.Finish(d, RequestOutcome{Status: 429, Immediate: true})
			m.Finish(d, RequestOutcome{Status: 500, Complete: true})
		} else {
			m.Finish(d, RequestOutcome{Status: 200, Complete: true, FirstByte: 30 * time.Millisecond})
		}
	}
	trips := m.Trips()
	if len(trips) != 1 || trips[0].Target != "llama-v2" || trips[0].Stable != "llama-v1" {
		t.Fatalf("trips %+v, want llama-v2 diverted to llama-v1", trips)
	}
	if trips[0].TargetErrorRatio != 1 {
		t.Fatalf("canary error ratio %v: immediate answers must not count as outcomes", trips[0].TargetErrorRatio)
	}
	for key := range canaryKeys {
		if d := choose(key); d.Kind != modelrewrite.KindDiverted || d.Model != "llama-v1" {
			t.Fatalf("canary session %s after the trip: %+v, want diverted to llama-v1", key, d)
		}
	}
	if rec.outcomes["llama-v1 failed=false ttft=30ms"] == 0 || rec.outcomes["llama-v2 failed=true ttft=0s"] == 0 {
		t.Fatalf("outcomes %v", rec.outcomes)
	}

	canary := modelrewrite.ObjectKey{Namespace: "default", Name: "canary"}
	other := modelrewrite.ObjectKey{Namespace: "default", Name: "other"}
	// Another object's token changing clears nothing of this one's.
	if cleared := m.ClearGuardrails(map[modelrewrite.ObjectKey]string{canary: "", other: "1"}); len(cleared) != 0 || len(m.Trips()) != 1 {
		t.Fatalf("cleared %+v by another object's token", cleared)
	}
	if cleared := m.ClearGuardrails(map[modelrewrite.ObjectKey]string{canary: "t1"}); len(cleared) != 1 || len(m.Trips()) != 0 {
		t.Fatalf("a new token cleared %+v, trips left %+v", cleared, m.Trips())
	}
	for key := range canaryKeys {
		d := choose(key)
		if d.Model != "llama-v2" {
			t.Fatalf("canary session %s after the clear: %+v", key, d)
		}
		// It fails again and trips again...
		for range 5 {
			m.Finish(d, RequestOutcome{Status: 500, Complete: true})
		}
		break
	}
	if len(m.Trips()) != 1 {
		t.Fatalf("trips %+v after fresh failures", m.Trips())
	}
	// ...and the same token does not clear it again; a new one does.
	if cleared := m.ClearGuardrails(map[modelrewrite.ObjectKey]string{canary: "t1"}); len(cleared) != 0 {
		t.Fatalf("an unchanged token cleared %+v", cleared)
	}
	if cleared := m.ClearGuardrails(map[modelrewrite.ObjectKey]string{canary: "t2"}); len(cleared) != 1 {
		t.Fatalf("a changed token cleared %+v", cleared)
	}
}

func TestModelRewriteCommandComplete(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		static  bool
		wantErr string
	}{
		{"defaults", nil, false, ""},
		{"file in static mode", []string{"--model-rewrites-file=x.yaml"}, true, ""},
		{"file in Kubernetes mode", []string{"--model-rewrites-file=x.yaml"}, false, "--model-rewrites-file is for static mode"},
		{"bad session header", []string{"--model-rewrite-session-header=x session"}, false, "--model-rewrite-session-header"},
		{"bad guardrail margin", []string{"--model-rewrite-guardrail", "--model-rewrite-guardrail-margin=2"}, false, "margin"},
		{"margin ignored while off", []string{"--model-rewrite-guardrail-margin=2"}, false, ""},
		{"bad CRD check interval", []string{"--model-rewrite-crd-check-interval=0s"}, false, "must be positive"},
		{"served model", []string{"--model-rewrite-response-model=served"}, false, ""},
		{"bad response model", []string{"--model-rewrite-response-model=target"}, false, "must be \"requested\" or \"served\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewModelRewriteCommand()
			parseFlags(t, c.AddFlags, tt.args)
			err := c.Complete(tt.static)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("Complete: %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

const rewritesFile = `
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata:
  name: first
spec:
  poolRef: {name: ignored-in-static-mode}
  rules:
  - matches: [{model: {value: llama}}]
    targets: [{modelRewrite: llama-v1}]
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata:
  name: second
spec:
  poolRef: {name: vllm}
  rules:
  - matches: [{model: {value: llama}}]
    targets: [{modelRewrite: shadowed}]
  - matches: [{model: {value: mistral}}]
    targets: [{modelRewrite: mistral-v2, weight: 9}, {modelRewrite: mistral-v3, weight: 1}]
`

func TestModelRewriteCommandStaticFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rewrites.yaml")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(rewritesFile)
	c := NewModelRewriteCommand()
	parseFlags(t, c.AddFlags, []string{"--model-rewrites-file=" + path})
	if err := c.Complete(true); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := clocktesting.NewFakeClock(rwT0)
	m, err := c.Start(ctx, ModelRewriteEnv{Pool: rwPool, StaticMode: true, ReloadInterval: time.Second, Registerer: reg, Clock: clk, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	model := func(body string) string {
		t.Helper()
		d, _ := m.Choose(nil, []byte(body))
		return d.Model
	}
	// File order is precedence: "first" wins "llama"; "second" still
	// serves "mistral".
	if got := model(`{"model":"llama"}`); got != "llama-v1" {
		t.Fatalf("llama -> %q, want llama-v1 (the earlier object)", got)
	}
	if got := model(`{"model":"mistral","user":"u"}`); got != "mistral-v2" && got != "mistral-v3" {
		t.Fatalf("mistral -> %q", got)
	}
	if got := countedTargets(t, reg, "sluice_modelrewrite_decisions_total"); len(got) != 2 || !got["llama-v1"] {
		t.Fatalf("decisions counted for targets %v, want llama-v1 and one mistral", got)
	}

	// A reload that fails keeps the rules; a valid change applies.
	w := &rewritesFileWatcher{path: path, target: m, logger: logr.Discard()}
	write(strings.Replace(rewritesFile, "{modelRewrite: llama-v1}", "{modelRewrite: llama-v1, weight: 2}, {modelRewrite: llama-v9}", 1))
	if err := w.load(); err == nil || !strings.Contains(err.Error(), "MixedWeights") {
		t.Fatalf("load of mixed weights: %v", err)
	}
	if got := model(`{"model":"llama"}`); got != "llama-v1" {
		t.Fatalf("after a failed reload llama -> %q, want the previous rules", got)
	}
	write(strings.Replace(rewritesFile, "llama-v1", "llama-v4", 1))
	if err := w.load(); err != nil {
		t.Fatal(err)
	}
	if got := model(`{"model":"llama"}`); got != "llama-v4" {
		t.Fatalf("after a reload llama -> %q, want llama-v4", got)
	}
	write(strings.Replace(rewritesFile, "name: second", "name: second\n  namespace: elsewhere", 1))
	if err := w.load(); err == nil || !strings.Contains(err.Error(), "namespace must be the pool's") {
		t.Fatalf("load of another namespace: %v", err)
	}
	write("")
	if err := w.load(); err != nil {
		t.Fatal(err)
	}
	if d, rewritten := m.Choose(nil, []byte(`{"model":"llama"}`)); rewritten {
		t.Fatalf("an empty file leaves rules in force: %+v", d)
	}
}

func TestParseModelRewrites(t *testing.T) {
	tests := []struct {
		name, content, wantErr string
		want                   int
	}{
		{"two documents", rewritesFile, "", 2},
		{"empty", "\n---\n", "", 0},
		{"wrong kind", "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: x}\n", "kind InferenceModelRewrite", 0},
		{"no name", "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModelRewrite\n", "metadata.name is required", 0},
		{"unknown field", "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModelRewrite\nmetadata: {name: x}\nspec: {rulez: []}\n", "rulez", 0},
		{"twice", rewritesFile + "---\n" + rewritesFile[strings.Index(rewritesFile, "apiVersion"):strings.Index(rewritesFile, "---")], "defined twice", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := ParseModelRewrites([]byte(tt.content))
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("err %v, want containing %q", err, tt.wantErr)
			}
			if len(objs) != tt.want {
				t.Fatalf("%d objects, want %d", len(objs), tt.want)
			}
		})
	}
}

// countedTargets returns the target labels of the counter's non-zero series.
func countedTargets(t *testing.T, g prometheus.Gatherer, name string) map[string]bool {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "target" && m.GetCounter().GetValue() > 0 {
					targets[l.GetValue()] = true
				}
			}
		}
	}
	return targets
}

func parseFlags(t *testing.T, add func(*pflag.FlagSet), args []string) {
	t.Helper()
	fs := pflag.NewFlagSet("epp", pflag.ContinueOnError)
	add(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
}

func servingEndpoint(name string, baseModels ...string) fwksched.Endpoint {
	attrs := fwkdl.NewAttributes()
	if baseModels != nil {
		res := &LoRAResidency{BaseModels: map[string]struct{}{}}
		for _, b := range baseModels {
			res.BaseModels[b] = struct{}{}
		}
		attrs.Put(LoRAResidencyKey, res)
	}
	return fwksched.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: k8stypes.NamespacedName{Namespace: "default", Name: name}}, fwkdl.NewMetrics(), attrs)
}

func TestServedModelFilter(t *testing.T) {
	p, err := ServedModelFilterFactory("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := p.(*ServedModelFilter)
	eps := []fwksched.Endpoint{servingEndpoint("a1", "llama-v1"), servingEndpoint("b1", "llama-v2"), servingEndpoint("a2", "llama-v1"), servingEndpoint("unknown")}
	names := func(eps []fwksched.Endpoint) string {
		var out []string
		for _, ep := range eps {
			out = append(out, ep.GetMetadata().NamespacedName.Name)
		}
		return strings.Join(out, ",")
	}
	tests := []struct {
		name string
		req  *fwksched.LLMRequest
		want string
	}{
		{"base model served by some", &fwksched.LLMRequest{TargetModel: "llama-v1"}, "a1,a2"},
		{"the other group", &fwksched.LLMRequest{TargetModel: "llama-v2"}, "b1"},
		{"an adapter passes all", &fwksched.LLMRequest{TargetModel: "sql-lora"}, "a1,b1,a2,unknown"},
		{"no target passes all", &fwksched.LLMRequest{}, "a1,b1,a2,unknown"},
		{"no request passes all", nil, "a1,b1,a2,unknown"},
	}
	for _, tt := range tests {
		if got := names(f.Filter(context.Background(), nil, tt.req, eps)); got != tt.want {
			t.Errorf("%s: kept %s, want %s", tt.name, got, tt.want)
		}
	}
	if _, err := ServedModelFilterFactory("x", []byte(`{"strict":true}`), nil); err == nil {
		t.Fatal("parameters accepted")
	}
}

func TestReplaceModel(t *testing.T) {
	tests := []struct {
		name, body, want, wantErr string
	}{
		{"only the top-level model", `{"messages":[{"model":"x"}], "model" : "llama","n":1}`, `{"messages":[{"model":"x"}], "model" : "canary","n":1}`, ""},
		{"escaped", `{"model":"llama"}`, `{"model":"can\"ary"}`, ""},
		{"non-string model", `{"model":7}`, `{"model":"canary"}`, ""},
		{"no model", `{"prompt":"x"}`, "", "no \"model\""},
		{"not an object", `["model"]`, "", "not a JSON object"},
		{"truncated", `{"prompt":"x","mod`, "", "request body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			model := "canary"
			if tt.name == "escaped" {
				model = `can"ary`
			}
			got, err := ReplaceModel([]byte(tt.body), model)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || string(got) != tt.want {
				t.Fatalf("got %s (%v), want %s", got, err, tt.want)
			}
		})
	}
}

// FuzzReplaceModel: whenever ReplaceModel succeeds, the result is the same
// JSON object with only its top-level "model" changed.
func FuzzReplaceModel(f *testing.F) {
	f.Add([]byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true}`), "canary")
	f.Add([]byte(`{"a":{"model":1},"model":null}`), "x\u2028y")
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		if !utf8.ValidString(model) {
			return // model names come from Kubernetes objects: valid UTF-8
		}
		out, err := ReplaceModel(body, model)
		if err != nil {
			return
		}
		var before, after map[string]any
		if err := json.Unmarshal(body, &before); err != nil {
			return // a prefix was an object; the rest is not ours to judge
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("%s -> %s: invalid JSON: %v", body, out, err)
		}
		if got, _ := after["model"].(string); got != model {
			t.Fatalf("%s -> %s: model %q, want %q", body, out, got, model)
		}
		delete(before, "model")
		delete(after, "model")
		if fmt.Sprint(before) != fmt.Sprint(after) {
			t.Fatalf("%s -> %s: other fields changed", body, out)
		}
	})
}

// TestReadRewriteFieldsAsUnmarshal: the streaming read of "model" and "user"
// finds what json.Unmarshal into rewriteFields finds, on the bodies whose
// decoding has a rule of its own.
func TestReadRewriteFieldsAsUnmarshal(t *testing.T) {
	for _, body := range []string{
		`{"model":"a","user":"u","messages":[{"role":"user","content":"x"}]}`,
		`{"messages":[{"model":"nested"}],"model":"top"}`,
		`{"model":"a","model":"b"}`,
		`{"MODEL":"folded","Model":"last","uſer":"long s"}`,
		`{"mod\u0065l":"escaped key","user":"caf\u00e9"}`,
		`{"model":"\ud800 lone surrogate","user":null}`,
		"{\"model\":\"bad utf-8 \xff\"}",
		`{"model":1,"user":["x"]}`,
		`{"model":null}`,
		`{}`,
		` { "model" : "spaced" , "user" : "s" } `,
		`{"model":"a"} trailing`,
		`{"model":"a",}`,
		`{"model":"unterminated}`,
		`["model","a"]`,
		`null`,
		`"model"`,
		``,
		`{"a":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `,"model":"too deep"}`,
		`{"a":` + strings.Repeat("[", 9998) + strings.Repeat("]", 9998) + `,"model":"deep"}`,
	} {
		t.Run(body[:min(len(body), 40)], func(t *testing.T) {
			checkRewriteFields(t, []byte(body))
		})
	}
}

// checkRewriteFields fails when readRewriteFields finds other inputs to a
// rewrite decision than json.Unmarshal does.
func checkRewriteFields(t *testing.T, body []byte) {
	t.Helper()
	var want rewriteFields
	wantOK := json.Unmarshal(body, &want) == nil
	got, gotOK := readRewriteFields(body)
	if d, w := decisionInputs(got, gotOK), decisionInputs(want, wantOK); d != w {
		t.Fatalf("%q: read %s, json.Unmarshal %s", body, d, w)
	}
}

// decisionInputs is what Choose makes of the fields: the model (none unless a
// non-empty string) and the user, if it decodes as a string.
func decisionInputs(f rewriteFields, ok bool) string {
	if !ok {
		return "none"
	}
	var model, user string
	if json.Unmarshal(f.Model, &model) != nil || model == "" {
		return "none"
	}
	userOK := json.Unmarshal(f.User, &user) == nil
	return fmt.Sprintf("model %q user %q (%v)", model, user, userOK)
}

// FuzzReadRewriteFields holds the model selector's read of a request body
// (untrusted input) to json.Unmarshal's.
func FuzzReadRewriteFields(f *testing.F) {
	f.Add([]byte(`{"model":"llama","user":"u","messages":[{"role":"user","content":"hi"}],"stream":true}`))
	f.Add([]byte(`{"Model":"a","mOdel":"b","user":null,"x":{"model":"c"}}`))
	f.Add([]byte(`{"model":"\u006d","us\u0065r":"\ud83d\ude00"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkRewriteFields(t, body)
	})
}
