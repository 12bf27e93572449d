package crds

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sluice-gw/sluice/crds/internal/apitest"
	"github.com/sluice-gw/sluice/flowcontrol"
)

// apiClient returns a strict client (unknown fields are errors, as with kubectl) of the envtest API server and a
// fresh namespace for the test.
func apiClient(t *testing.T) (client.Client, string, *rest.Config) {
	t.Helper()
	cfg := apitest.Config(t)
	scheme := runtime.NewScheme()
	if err := Install(scheme); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme, FieldValidation: metav1.FieldValidationStrict})
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "fcp-"}}
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), ns) })
	return c, ns.Name, cfg
}

// policyFromSpecYAML builds an untyped FlowControlPolicy so that specs Go cannot represent (bad durations, unknown
// fields) reach the API server as written.
func policyFromSpecYAML(t *testing.T, ns, name, specYAML string) *unstructured.Unstructured {
	t.Helper()
	obj := map[string]any{}
	if err := yaml.Unmarshal([]byte("apiVersion: sluice.dev/v1alpha1\nkind: FlowControlPolicy\n"+specYAML), &obj); err != nil {
		t.Fatalf("test spec: %v", err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// TestSchemaRejectsNonsense submits invalid policies to the API server and checks the error names the problem.
// Where the spec can be represented in Go, ToConfig must reject it too (toConfig: true), so that an object stored
// before a rule existed is reported by the reconciler rather than applied.
func TestSchemaRejectsNonsense(t *testing.T) {
	c, ns, _ := apiClient(t)
	const pool = "spec:\n  poolRef: {name: pool}\n"
	for _, tc := range []struct {
		name     string
		yaml     string
		want     []string
		toConfig bool
	}{
		{"no spec", "metadata: {}\n", []string{"spec: Required value"}, false},
		{"no pool name", "spec:\n  poolRef: {}\n", []string{"spec.poolRef.name: Required value"}, false},
		{"pool kind", "spec:\n  poolRef: {name: p, kind: Service}\n", []string{`spec.poolRef.kind: Unsupported value: "Service"`}, false},
		{"pool group", "spec:\n  poolRef: {name: p, group: apps}\n", []string{`spec.poolRef.group: Unsupported value: "apps"`}, false},
		{"negative global capacities", pool + "  maxQueuedRequests: -1\n  maxQueuedBytes: -1\n",
			[]string{"spec.maxQueuedRequests in body should be greater than or equal to 0",
				"spec.maxQueuedBytes in body should be greater than or equal to 0"}, true},
		{"negative band capacities", pool + "  bands:\n    sheddable: {maxQueuedRequests: -3, maxQueuedBytes: -4}\n",
			[]string{"spec.bands.sheddable.maxQueuedRequests in body should be greater than or equal to 0",
				"spec.bands.sheddable.maxQueuedBytes in body should be greater than or equal to 0"}, true},
		{"ceiling zero", pool + "  bands:\n    critical: {saturationCeiling: 0}\n",
			[]string{"spec.bands.critical.saturationCeiling in body should be greater than 0"}, true},
		{"ceiling above one", pool + "  bands:\n    critical: {saturationCeiling: 1.5}\n",
			[]string{"spec.bands.critical.saturationCeiling in body should be less than or equal to 1"}, true},
		{"sheddable ceiling above standard's (default 0.6 over 0.4)", pool + "  bands:\n    standard: {saturationCeiling: 0.4}\n",
			[]string{"inverted ceilings: sheddable.saturationCeiling must not exceed standard.saturationCeiling"}, true},
		{"standard ceiling above critical's", pool + "  bands:\n    critical: {saturationCeiling: 0.5}\n    standard: {saturationCeiling: 0.9}\n    sheddable: {saturationCeiling: 0.4}\n",
			[]string{"inverted ceilings: standard.saturationCeiling must not exceed critical.saturationCeiling"}, true},
		{"retryAfterMin above retryAfterMax (default 15s)", pool + "  bands:\n    critical: {retryAfterMin: 20s}\n",
			[]string{"spec.bands.critical: Invalid value: retryAfterMin must not exceed retryAfterMax"}, true},
		{"retryAfterMin below 1s", pool + "  bands:\n    standard: {retryAfterMin: 500ms}\n",
			[]string{"retryAfterMin must be at least 1s"}, true},
		{"retryAfterMax below 1s", pool + "  bands:\n    sheddable: {retryAfterMax: 100ms}\n",
			[]string{"retryAfterMax must be at least 1s"}, true},
		{"criticalMinPriority equal to sheddableMaxPriority", pool + "  priorityMapping: {criticalMinPriority: 0, sheddableMaxPriority: 0}\n",
			[]string{"spec.priorityMapping: Invalid value: sheddableMaxPriority must be below criticalMinPriority"}, true},
		{"criticalMinPriority below default sheddableMaxPriority", pool + "  priorityMapping: {criticalMinPriority: -5}\n",
			[]string{"sheddableMaxPriority must be below criticalMinPriority"}, true},
		{"zero queue time", pool + "  bands:\n    critical: {maxQueueTime: 0s}\n", []string{"maxQueueTime must be positive"}, true},
		{"negative duration", pool + "  bands:\n    critical: {maxQueueTime: -5s}\n",
			[]string{"spec.bands.critical.maxQueueTime in body should match"}, true},
		{"duration with days", pool + "  drainRateWindow: 1d\n", []string{"spec.drainRateWindow in body should match"}, false},
		{"duration beyond time.Duration", pool + "  drainRateWindow: 9999999999h\n", []string{"spec.drainRateWindow", "type conversion error"}, false},
		{"duration without unit", pool + "  endpoint: {metricsStalenessThreshold: \"200\"}\n",
			[]string{"spec.endpoint.metricsStalenessThreshold in body should match"}, false},
		{"endpoint thresholds", pool + "  endpoint: {queueDepthThreshold: 0, kvCacheUtilThreshold: 1.2, runningThreshold: -1, metricsStalenessThreshold: 0s}\n",
			[]string{"spec.endpoint.queueDepthThreshold in body should be greater than or equal to 1",
				"spec.endpoint.kvCacheUtilThreshold in body should be less than or equal to 1",
				"spec.endpoint.runningThreshold in body should be greater than or equal to 0",
				"metricsStalenessThreshold must be positive"}, true},
		{"negative burst thresholds", pool + "  endpoint: {burstQueueDepthThreshold: -1, burstPendingTimeThreshold: -1s}\n",
			[]string{"spec.endpoint.burstQueueDepthThreshold in body should be greater than or equal to 0",
				"spec.endpoint.burstPendingTimeThreshold in body should match"}, true},
		{"kv threshold zero", pool + "  endpoint: {kvCacheUtilThreshold: 0}\n",
			[]string{"spec.endpoint.kvCacheUtilThreshold in body should be greater than 0"}, true},
		{"jitter one", pool + "  retryAfterJitter: 1\n", []string{"spec.retryAfterJitter in body should be less than 1"}, true},
		{"negative jitter", pool + "  retryAfterJitter: -0.1\n", []string{"spec.retryAfterJitter in body should be greater than or equal to 0"}, true},
		{"zero drain window", pool + "  drainRateWindow: 0s\n", []string{"drainRateWindow must be positive"}, true},
		{"duplicate tenant", pool + "  tenants: [{name: a}, {name: a}]\n", []string{"spec.tenants[1]: Duplicate value"}, true},
		{"unnamed tenant", pool + "  tenants: [{name: \"\"}]\n", []string{"spec.tenants[0].name in body should be at least 1 chars long"}, true},
		{"tenant band", pool + "  tenants: [{name: a, maxBand: Gold}]\n", []string{`spec.tenants[0].maxBand: Unsupported value: "Gold"`}, true},
		{"tenant weight", pool + "  tenants: [{name: a, weight: 0}, {name: b, weight: 2000000}]\n",
			[]string{"spec.tenants[0].weight in body should be greater than 0",
				"spec.tenants[1].weight in body should be less than or equal to 1000000"}, true},
		{"default tenant has no name", pool + "  defaultTenant: {name: x}\n", []string{`unknown field "spec.defaultTenant.name"`}, false},
		{"unknown field", pool + "  maxQueuedRequest: 5\n", []string{`unknown field "spec.maxQueuedRequest"`}, false},
		{"tenant header with a space", pool + "  tenantHeader: \"x auth\"\n", []string{"spec.tenantHeader in body should match"}, true},
		{"empty tenant header", pool + "  tenantHeader: \"\"\n", []string{"spec.tenantHeader in body should be at least 1 chars long"}, true},
		{"long tenant header", pool + "  tenantHeader: " + strings.Repeat("x", 257) + "\n", []string{"spec.tenantHeader: Too long"}, true},
		{"unknown cap action", pool + "  aboveMaxBand: Drop\n", []string{`spec.aboveMaxBand: Unsupported value: "Drop"`}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := policyFromSpecYAML(t, ns, "invalid", tc.yaml)
			err := c.Create(t.Context(), obj)
			if err == nil {
				_ = c.Delete(t.Context(), obj)
				t.Fatalf("the API server accepted %s", tc.yaml)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q\ndoes not mention %q", err, want)
				}
			}
			if !tc.toConfig {
				return
			}
			var p FlowControlPolicy
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &p); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if _, err := p.Spec.ToConfig(); err == nil {
				t.Errorf("the API server rejects this spec but ToConfig accepts it: %s", tc.yaml)
			}
		})
	}
}

// TestSchemaAcceptsValidPolicies creates valid policies, including the example and values at the edges of every
// range, and checks that what the API server stores converts.
func TestSchemaAcceptsValidPolicies(t *testing.T) {
	c, ns, _ := apiClient(t)
	example, err := os.ReadFile("../examples/flowcontrolpolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	exampleObj := map[string]any{}
	if err := yaml.Unmarshal(example, &exampleObj); err != nil {
		t.Fatalf("examples/flowcontrolpolicy.yaml: %v", err)
	}
	edges := `spec:
  poolRef: {name: pool, group: inference.networking.x-k8s.io, kind: InferencePool}
  maxQueuedRequests: 0
  maxQueuedBytes: 0
  bands:
    critical: {saturationCeiling: 1, maxQueueTime: 1h0m0s, retryAfterMin: 1s, retryAfterMax: 1s, mayDisplace: false}
    standard: {saturationCeiling: 1, maxQueueTime: 1.5s, maxQueuedRequests: 0}
    sheddable: {saturationCeiling: 0.01, maxQueueTime: 1ms, rejectWhenSaturated: false, retryAfterMax: 2m30s}
  priorityMapping: {criticalMinPriority: 0, sheddableMaxPriority: -1}
  endpoint: {queueDepthThreshold: 1, kvCacheUtilThreshold: 1, runningThreshold: 0, metricsStalenessThreshold: 1ns}
  tenants: [{name: a, weight: 1000000, maxBand: Sheddable}, {name: b, weight: 0.001}]
  defaultTenant: {maxBand: Standard}
  retryAfterJitter: 0
  drainRateWindow: 500us
  tenantHeader: X-Auth-Tenant
  aboveMaxBand: Reject
`
	for name, obj := range map[string]*unstructured.Unstructured{
		"example": {Object: exampleObj},
		"edges":   policyFromSpecYAML(t, ns, "edges", edges),
		"minimal": policyFromSpecYAML(t, ns, "minimal", "spec:\n  poolRef: {name: pool}\n"),
		// Normal thresholds above the burst defaults (16, 400ms), as a policy written before the burst tier may have.
		"deep normal thresholds": policyFromSpecYAML(t, ns, "deep", "spec:\n  poolRef: {name: pool}\n  endpoint: {queueDepthThreshold: 20, pendingTimeThreshold: 1s}\n"),
	} {
		t.Run(name, func(t *testing.T) {
			obj.SetNamespace(ns)
			if err := c.Create(t.Context(), obj); err != nil {
				t.Fatalf("the API server rejected a valid policy: %v", err)
			}
			var stored FlowControlPolicy
			if err := c.Get(t.Context(), client.ObjectKeyFromObject(obj), &stored); err != nil {
				t.Fatal(err)
			}
			if _, err := stored.Spec.ToConfig(); err != nil {
				t.Errorf("ToConfig of a policy the API server accepted: %v", err)
			}
		})
	}
}

// TestServerDefaultsAreFlowControlDefaults creates a policy with nothing but its pool and checks that the API server
// filled in every field, with flowcontrol's defaults.
func TestServerDefaultsAreFlowControlDefaults(t *testing.T) {
	c, ns, _ := apiClient(t)
	p := &FlowControlPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "minimal"},
		Spec:       FlowControlPolicySpec{PoolRef: PoolReference{Name: "pool"}},
	}
	if err := c.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	var stored FlowControlPolicy
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(p), &stored); err != nil {
		t.Fatal(err)
	}
	if got, want := stored.Spec.PoolRef, (PoolReference{Group: "inference.networking.k8s.io", Kind: "InferencePool", Name: "pool"}); got != want {
		t.Errorf("poolRef = %+v, want %+v", got, want)
	}
	// Without this, a field missing a default marker would fall back to flowcontrol's default in ToConfig and the
	// comparison below would pass while `kubectl get -o yaml` hides the value in force.
	for _, path := range unsetFields(reflect.ValueOf(stored.Spec), "spec") {
		if path != "spec.tenants" {
			t.Errorf("%s has no server-side default", path)
		}
	}
	got, err := stored.Spec.ToConfig()
	if err != nil {
		t.Fatalf("ToConfig: %v", err)
	}
	if want := flowcontrol.DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("ToConfig of the server-defaulted spec differs from flowcontrol.DefaultConfig():\n got %+v\nwant %+v", got, want)
	}
}

// unsetFields returns the paths of nil pointers and slices under v.
func unsetFields(v reflect.Value, path string) []string {
	switch v.Kind() {
	case reflect.Pointer, reflect.Slice:
		if v.IsNil() {
			return []string{path}
		}
		if v.Kind() == reflect.Pointer {
			return unsetFields(v.Elem(), path)
		}
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[metav1.Duration]() {
			return nil
		}
		var unset []string
		for i := range v.NumField() {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			unset = append(unset, unsetFields(v.Field(i), path+"."+name)...)
		}
		return unset
	}
	return nil
}

// TestStatusAndPrinterColumns writes a status through the status subresource and reads the table kubectl shows.
func TestStatusAndPrinterColumns(t *testing.T) {
	c, ns, cfg := apiClient(t)
	p := &FlowControlPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "policy"},
		Spec:       FlowControlPolicySpec{PoolRef: PoolReference{Name: "my-pool"}},
	}
	if err := c.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	p.Status.ObservedGeneration = p.Generation
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
		Type: ConditionAccepted, Status: metav1.ConditionFalse, Reason: ReasonPoolNotFound,
		Message: "InferencePool my-pool not found", ObservedGeneration: p.Generation,
		LastTransitionTime: metav1.NewTime(time.Unix(1700000000, 0)),
	})
	if err := c.Status().Update(t.Context(), p); err != nil {
		t.Fatalf("status update: %v", err)
	}

	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("%s/apis/sluice.dev/v1alpha1/namespaces/%s/flowcontrolpolicies", strings.TrimSuffix(cfg.Host, "/"), ns)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET table: %d %v %s", resp.StatusCode, err, body)
	}
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatalf("decode table: %v", err)
	}
	var columns []string
	for _, col := range table.ColumnDefinitions {
		columns = append(columns, col.Name)
	}
	if want := []string{"Name", "Pool", "Accepted", "Reason", "Age"}; !reflect.DeepEqual(columns, want) {
		t.Fatalf("columns %v, want %v", columns, want)
	}
	if len(table.Rows) != 1 {
		t.Fatalf("%d rows, want 1", len(table.Rows))
	}
	if got, want := table.Rows[0].Cells[:4], []any{"policy", "my-pool", "False", ReasonPoolNotFound}; !reflect.DeepEqual(got, want) {
		t.Errorf("row %v, want %v", got, want)
	}
}
