package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/sluice-gw/sluice/crds/rewritecontroller"
	"github.com/sluice-gw/sluice/modelrewrite"
	"github.com/sluice-gw/sluice/runner/runnertest"
)

// rewriteFixture is one EPP in Kubernetes mode in front of one (fake) model
// server, with a client that sends requests for the model "llama".
type rewriteFixture struct {
	t      *testing.T
	api    *runnertest.APIServer
	epp    *runnertest.Process
	server string
	// failing: replies to requests forwarded with this model are 500s.
	failing string
	n       int
}

func startRewriteFixture(t *testing.T, api *runnertest.APIServer, args ...string) *rewriteFixture {
	t.Helper()
	port := runnertest.FreePort(t)
	server := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.2:%d", port)).Addr
	api.CreatePool(t, port)
	api.CreateReadyPod(t, "vllm-a", "127.0.0.2")
	epp := runnertest.StartEPP(t, []string{"KUBECONFIG=" + api.Kubeconfig, "NAMESPACE=default"},
		append([]string{"--pool-name=vllm", "--secure-serving=false", "--metrics-endpoint-auth=false"}, args...)...)
	return &rewriteFixture{t: t, api: api, epp: epp, server: server}
}

// send sends a streamed chat request for "llama" (with session key when not
// empty), plays a streamed answer that names the model it was forwarded
// with, and returns that model. Every request must be routed, whatever the
// rewrites are doing, and every chunk must name "llama" to the client.
func (f *rewriteFixture) send(session string) string {
	f.t.Helper()
	f.n++
	headers := map[string]string{}
	if session != "" {
		headers["x-session-id"] = session
	}
	body := map[string]any{"model": "llama", "stream": true, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("hello %d", f.n)}}}
	x := runnertest.Exchange(f.t, f.epp.GRPCPort, headers, body, runnertest.Reply{ContentType: "text/event-stream"})
	if x.Destination != f.server {
		f.t.Fatalf("request %d not routed to %s: %+v", f.n, f.server, x.Answer)
	}
	var forwarded struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal([]byte(x.RequestBody), &forwarded); err != nil {
		f.t.Fatalf("forwarded body %q: %v", x.RequestBody, err)
	}
	return forwarded.Model
}

// sendAndReply is send with a streamed reply from the server that serves
// the forwarded model: chunks naming it, a 500 when it is f.failing.
// It checks that the client only ever sees "llama".
func (f *rewriteFixture) sendAndReply(session string) string {
	f.t.Helper()
	// Route once to learn the model, then replay the same request with the
	// server's answer: a session key pins the choice, so both agree.
	model := f.send(session)
	chunk := func(i int) string {
		return fmt.Sprintf(`data: {"id":"c","object":"chat.completion.chunk","model":"%s","choices":[{"index":0,"delta":{"content":"t%d"}}]}`+"\n\n", model, i)
	}
	reply := runnertest.Reply{ContentType: "text/event-stream", Chunks: []string{chunk(0), chunk(1), "data: [DONE]\n\n"}}
	if model == f.failing {
		reply = runnertest.Reply{Status: 500, ContentType: "application/json", Chunks: []string{`{"error":{"message":"boom","model":"` + model + `"}}`}}
	}
	f.n++
	headers := map[string]string{"x-session-id": session}
	body := map[string]any{"model": "llama", "stream": true, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("hello %d", f.n)}}}
	x := runnertest.Exchange(f.t, f.epp.GRPCPort, headers, body, reply)
	if !strings.Contains(x.RequestBody, `"model":"`+model+`"`) {
		f.t.Fatalf("replayed request forwarded as %s, want model %q (sticky)", x.RequestBody, model)
	}
	if reply.Status == 0 {
		for _, c := range x.ResponseChunks[:len(x.ResponseChunks)-1] {
			if !strings.Contains(c, `"model":"llama"`) || (model != "llama" && strings.Contains(c, model)) {
				f.t.Fatalf("client saw chunk %q, want the model it asked for, llama", c)
			}
		}
	}
	return model
}

// eventually retries until want is the model a request is forwarded with.
func (f *rewriteFixture) eventuallyForwardedAs(what, want string) {
	f.t.Helper()
	runnertest.Eventually(f.t, what, func() string {
		if got := f.send(""); got != want {
			return fmt.Sprintf("forwarded as %q, want %q", got, want)
		}
		return ""
	})
}

func (f *rewriteFixture) condition(name, typ string) *metav1.Condition {
	f.t.Helper()
	var got v1alpha2.InferenceModelRewrite
	if err := f.api.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &got); err != nil {
		f.t.Fatal(err)
	}
	c := meta.FindStatusCondition(got.Status.Conditions, typ)
	if c != nil && c.ObservedGeneration != got.Generation {
		return nil // not about the current spec yet
	}
	return c
}

func (f *rewriteFixture) eventuallyCondition(name, typ string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	f.t.Helper()
	var c *metav1.Condition
	runnertest.Eventually(f.t, fmt.Sprintf("%s: %s=%s/%s", name, typ, status, reason), func() string {
		if c = f.condition(name, typ); c == nil || c.Status != status || c.Reason != reason {
			return fmt.Sprintf("condition %+v", c)
		}
		return ""
	})
	return c
}

func canary(weights ...int32) *v1alpha2.InferenceModelRewrite {
	rw := &v1alpha2.InferenceModelRewrite{
		ObjectMeta: metav1.ObjectMeta{Name: "llama-canary", Namespace: "default"},
		Spec: v1alpha2.InferenceModelRewriteSpec{
			PoolRef: &v1alpha2.PoolObjectReference{Name: "vllm"},
			Rules:   []v1alpha2.InferenceModelRewriteRule{{Matches: []v1alpha2.Match{{Model: &v1alpha2.ModelMatch{Value: "llama"}}}}},
		},
	}
	for i, w := range weights {
		rw.Spec.Rules[0].Targets = append(rw.Spec.Rules[0].Targets, v1alpha2.TargetModel{ModelRewrite: fmt.Sprintf("llama-v%d", i+1), Weight: w})
	}
	return rw
}

// TestModelRewriteLive runs the EPP binary against a real API server and
// changes an InferenceModelRewrite while requests flow: created, it takes
// effect (sticky per session, the client still sees its model name in every
// streamed chunk); updated, the new weights are honoured and the status
// follows the generation; an invalid object is rejected with its reason; the
// guardrail diverts a failing canary and an annotation clears it; deleted,
// requests go out unchanged.
func TestModelRewriteLive(t *testing.T) {
	api := runnertest.StartAPIServer(t, nil, v1alpha2.Install)
	f := startRewriteFixture(t, api, "--model-rewrite-guardrail", "--model-rewrite-guardrail-min-requests=5")
	c := api.Client
	ctx := context.Background()

	if got := f.send(""); got != "llama" {
		t.Fatalf("without rewrites, forwarded as %q", got)
	}

	rw := canary(1)
	if err := c.Create(ctx, rw); err != nil {
		t.Fatal(err)
	}
	f.eventuallyForwardedAs("a created rewrite takes effect", "llama-v1")
	f.eventuallyCondition(rw.Name, rewritecontroller.ConditionAccepted, metav1.ConditionTrue, "Accepted")
	if got := f.sendAndReply("s-0"); got != "llama-v1" {
		t.Fatalf("forwarded as %q", got)
	}

	// Update: 1:1 between v1 and v2. Sessions stick to their target.
	if err := c.Get(ctx, client.ObjectKeyFromObject(rw), rw); err != nil {
		t.Fatal(err)
	}
	rw.Spec.Rules[0].Targets = canary(1, 1).Spec.Rules[0].Targets
	if err := c.Update(ctx, rw); err != nil {
		t.Fatal(err)
	}
	runnertest.Eventually(t, "the update takes effect", func() string {
		if got := f.send("probe"); got == "llama" {
			return "not rewritten"
		}
		seen := map[string]int{}
		for i := range 30 {
			seen[f.send(fmt.Sprintf("s-%d", i))]++
		}
		if seen["llama-v1"] == 0 || seen["llama-v2"] == 0 || len(seen) != 2 {
			return fmt.Sprintf("30 sessions went to %v, want both targets", seen)
		}
		return ""
	})
	if c := f.eventuallyCondition(rw.Name, rewritecontroller.ConditionAccepted, metav1.ConditionTrue, "Accepted"); c.ObservedGeneration != 2 {
		t.Fatalf("observedGeneration %d after one update, want 2", c.ObservedGeneration)
	}
	for i := range 10 {
		session := fmt.Sprintf("s-%d", i)
		if a, b := f.sendAndReply(session), f.send(session); a != b {
			t.Fatalf("session %s went to %s, then %s", session, a, b)
		}
	}

	// An invalid object (mixed weighted and unweighted targets; the CRD's
	// schema allows it) is rejected and changes nothing.
	mixed := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha2.GroupVersion.String(), "kind": "InferenceModelRewrite",
		"metadata": map[string]any{"name": "mixed", "namespace": "default"},
		"spec": map[string]any{
			"poolRef": map[string]any{"name": "vllm"},
			"rules": []any{map[string]any{
				"matches": []any{map[string]any{"model": map[string]any{"value": "other"}}},
				"targets": []any{map[string]any{"modelRewrite": "a", "weight": int64(5)}, map[string]any{"modelRewrite": "b"}},
			}},
		},
	}}
	if err := c.Create(ctx, mixed); err != nil {
		t.Fatal(err)
	}
	cond := f.eventuallyCondition("mixed", rewritecontroller.ConditionAccepted, metav1.ConditionFalse, string(modelrewrite.ReasonMixedWeights))
	if !strings.Contains(cond.Message, "spec.rules[0].targets") {
		t.Fatalf("message %q does not name the field", cond.Message)
	}

	// Guardrail: v2 answers 500s, v1 succeeds; v2 trips and its sessions go
	// to v1 (the stable target: the first of equal weights), and the status
	// says so.
	canarySessions := map[string]bool{}
	for i := 0; len(canarySessions) < 4; i++ {
		if session := fmt.Sprintf("g-%d", i); f.send(session) == "llama-v2" {
			canarySessions[session] = true
		}
		if i > 200 {
			t.Fatalf("only %d of 200 sessions went to the canary", len(canarySessions))
		}
	}
	f.failing = "llama-v2"
	runnertest.Eventually(t, "failing canary requests trip the guardrail", func() string {
		for session := range canarySessions {
			f.sendAndReply(session)
		}
		if c := f.condition(rw.Name, rewritecontroller.ConditionGuardrailTripped); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Sprintf("condition %+v", c)
		}
		return ""
	})
	tripped := f.eventuallyCondition(rw.Name, rewritecontroller.ConditionGuardrailTripped, metav1.ConditionTrue, rewritecontroller.ReasonErrorRatioExceeded)
	if !strings.Contains(tripped.Message, `"llama-v2"`) || !strings.Contains(tripped.Message, modelrewrite.ClearGuardrailAnnotation) {
		t.Fatalf("message %q should name the target and how to clear it", tripped.Message)
	}
	for session := range canarySessions {
		if got := f.send(session); got != "llama-v1" {
			t.Fatalf("canary session %s forwarded as %q after the trip, want the stable llama-v1", session, got)
		}
	}
	f.failing = ""
	if err := c.Get(ctx, client.ObjectKeyFromObject(rw), rw); err != nil {
		t.Fatal(err)
	}
	metav1.SetMetaDataAnnotation(&rw.ObjectMeta, modelrewrite.ClearGuardrailAnnotation, "1")
	if err := c.Update(ctx, rw); err != nil {
		t.Fatal(err)
	}
	f.eventuallyCondition(rw.Name, rewritecontroller.ConditionGuardrailTripped, metav1.ConditionFalse, rewritecontroller.ReasonNoTargetDiverted)
	for session := range canarySessions {
		if got := f.send(session); got != "llama-v2" {
			t.Fatalf("canary session %s forwarded as %q after the clear, want llama-v2 again", session, got)
		}
		break
	}

	// Per-target metrics.
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", f.epp.MetricsPort))
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`sluice_modelrewrite_decisions_total{kind="sticky",rewrite="default/llama-canary",rule="0",target="llama-v2"}`,
		`sluice_modelrewrite_decisions_total{kind="diverted",rewrite="default/llama-canary",rule="0",target="llama-v1"}`,
		`sluice_modelrewrite_outcomes_total{outcome="error",rewrite="default/llama-canary",rule="0",target="llama-v2"}`,
		`sluice_modelrewrite_ttft_seconds_count{rewrite="default/llama-canary",rule="0",target="llama-v1"}`,
	} {
		if !strings.Contains(string(page), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	if err := c.Delete(ctx, rw); err != nil {
		t.Fatal(err)
	}
	f.eventuallyForwardedAs("a deleted rewrite stops", "llama")
}

// TestModelRewriteCRDInstalledAfterStart starts the EPP on an API server
// without the InferenceModelRewrite CRD, installs it, and sees a rewrite
// created then take effect and get its status, without a restart.
func TestModelRewriteCRDInstalledAfterStart(t *testing.T) {
	crdDir := runnertest.GIECRDDir(t)
	entries, err := os.ReadDir(crdDir)
	if err != nil {
		t.Fatal(err)
	}
	var crds []string
	rewriteCRD := ""
	for _, e := range entries {
		p := filepath.Join(crdDir, e.Name())
		if strings.Contains(e.Name(), "inferencemodelrewrites") {
			rewriteCRD = p
			continue
		}
		crds = append(crds, p)
	}
	if rewriteCRD == "" {
		t.Fatalf("no InferenceModelRewrite CRD in %s", crdDir)
	}
	api := runnertest.StartAPIServerWithCRDs(t, crds, v1alpha2.Install)
	f := startRewriteFixture(t, api, "--model-rewrite-crd-check-interval=500ms")
	if got := f.send(""); got != "llama" {
		t.Fatalf("without the CRD, forwarded as %q", got)
	}

	api.InstallCRDs(t, rewriteCRD)
	rw := canary(1)
	runnertest.Eventually(t, "the new CRD accepts objects", func() string {
		if err := api.Client.Create(context.Background(), rw); err != nil {
			return err.Error()
		}
		return ""
	})
	f.eventuallyForwardedAs("a rewrite created after the CRD was installed takes effect", "llama-v1")
	f.eventuallyCondition(rw.Name, rewritecontroller.ConditionAccepted, metav1.ConditionTrue, "Accepted")
}

// TestModelRewriteStaticMode runs the EPP binary without Kubernetes, rules
// from --model-rewrites-file: the request goes out with the target model,
// and streamed chunks name the model the client asked for, or, with
// --model-rewrite-response-model=served, the one that served it.
func TestModelRewriteStaticMode(t *testing.T) {
	server := runnertest.StartModelServer(t, "127.0.0.2:0").Addr
	file := filepath.Join(t.TempDir(), "rewrites.yaml")
	if err := os.WriteFile(file, []byte(`apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {name: llama-canary}
spec:
  rules:
  - matches: [{model: {value: llama}}]
    targets: [{modelRewrite: llama-v2}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	chunk := `data: {"id":"c","object":"chat.completion.chunk","model":"llama-v2","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n"
	for _, tt := range []struct {
		responseModel, clientSees string
	}{
		{"requested", "llama"},
		{"served", "llama-v2"},
	} {
		t.Run(tt.responseModel, func(t *testing.T) {
			epp := runnertest.StartEPP(t, nil, "--static-endpoints="+server, "--secure-serving=false",
				"--model-rewrites-file="+file, "--model-rewrite-response-model="+tt.responseModel)
			body := map[string]any{"model": "llama", "stream": true, "messages": []map[string]string{{"role": "user", "content": "hi"}}}
			x := runnertest.Exchange(t, epp.GRPCPort, nil, body, runnertest.Reply{ContentType: "text/event-stream", Chunks: []string{chunk, "data: [DONE]\n\n"}})
			if x.Destination != server || !strings.Contains(x.RequestBody, `"model":"llama-v2"`) {
				t.Fatalf("forwarded %s to %q, want model llama-v2 to %s", x.RequestBody, x.Destination, server)
			}
			if len(x.ResponseChunks) != 2 || !strings.Contains(x.ResponseChunks[0], `"model":"`+tt.clientSees+`"`) {
				t.Fatalf("client saw %q, want chunks naming %s", x.ResponseChunks, tt.clientSees)
			}
		})
	}
}
