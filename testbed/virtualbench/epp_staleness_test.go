package virtualbench

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	configapi "sigs.k8s.io/gateway-api-inference-extension/apix/config/v1alpha1"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization"
)

// TestStalenessAsUpstreamsDetectorSeesIt drives upstream's real utilization detector with metrics of given ages on
// the virtual clock, as the in-process EPP shows them: it must judge them fresh exactly while they are at most its
// threshold old, whatever the wall clock reads (the virtual epoch is in 2025).
func TestStalenessAsUpstreamsDetectorSeesIt(t *testing.T) {
	for _, threshold := range []time.Duration{utilization.DefaultMetricsStalenessThreshold, 3 * time.Second} {
		params := json.RawMessage(`{"metricsStalenessThreshold":"` + threshold.String() + `"}`)
		raw := &configapi.EndpointPickerConfig{Plugins: []configapi.PluginSpec{{Name: "d", Type: utilization.UtilizationDetectorType, Parameters: params}}}
		view, err := stalenessOf(raw)
		if err != nil {
			t.Fatal(err)
		}
		pl, err := utilization.UtilizationDetectorFactory("d", params, fwkplugin.NewEppHandle(t.Context(), nil))
		if err != nil {
			t.Fatal(err)
		}
		detector := pl.(*utilization.Detector)
		now := epoch.Add(time.Hour)
		for _, tc := range []struct {
			name  string
			age   time.Duration
			stale bool
		}{
			{"just scraped", 0, false},
			{"just under the threshold", threshold - 1, false},
			{"exactly the threshold", threshold, false},
			{"just over the threshold", threshold + 1, true},
			{"an hour old", time.Hour, true},
		} {
			m := &fwkdl.Metrics{UpdateTime: view.updateTime(now.Add(-tc.age), now)}
			md := &fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: "e"}}
			saturation := detector.Saturation(t.Context(), []fwkdl.Endpoint{fwkdl.NewEndpoint(md, m)})
			if stale := saturation == 1; stale != tc.stale {
				t.Errorf("threshold %v, %s: saturation %v (stale %v), want stale %v", threshold, tc.name, saturation, stale, tc.stale)
			}
			// As a filter, the detector drops stale endpoints (and keeps all when it would drop every one).
			idle := fwksched.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: "fresh"}},
				&fwkdl.Metrics{UpdateTime: view.updateTime(now, now)}, nil)
			probe := fwksched.NewEndpoint(md, m, nil)
			kept := detector.Filter(t.Context(), nil, nil, []fwksched.Endpoint{idle, probe})
			if dropped := len(kept) == 1; dropped != tc.stale {
				t.Errorf("threshold %v, %s: the filter kept %d of 2, want the probe dropped %v", threshold, tc.name, len(kept), tc.stale)
			}
		}
		if got := view.updateTime(time.Time{}, now); !got.IsZero() {
			t.Errorf("never scraped: shown %v, want the zero time", got)
		}
	}
}

func TestStalenessOf(t *testing.T) {
	spec := func(name, params string) configapi.PluginSpec {
		s := configapi.PluginSpec{Name: name, Type: utilization.UtilizationDetectorType}
		if params != "" {
			s.Parameters = json.RawMessage(params)
		}
		return s
	}
	for _, tc := range []struct {
		name    string
		plugins []configapi.PluginSpec
		want    staleness
		err     string
	}{
		{"no detector: UpdateTime unchanged", []configapi.PluginSpec{{Name: "q", Type: "queue-scorer"}}, staleness{}, ""},
		{"upstream's default", []configapi.PluginSpec{spec("d", "")}, staleness{threshold: 200 * time.Millisecond, checked: true}, ""},
		{"configured", []configapi.PluginSpec{spec("d", `{"queueDepthThreshold":3,"metricsStalenessThreshold":"1s"}`)},
			staleness{threshold: time.Second, checked: true}, ""},
		{"two that agree", []configapi.PluginSpec{spec("a", `{"metricsStalenessThreshold":"200ms"}`), spec("b", "")},
			staleness{threshold: 200 * time.Millisecond, checked: true}, ""},
		{"two that disagree", []configapi.PluginSpec{spec("a", `{"metricsStalenessThreshold":"1s"}`), spec("b", "")},
			staleness{}, "different metricsStalenessThresholds"},
	} {
		got, err := stalenessOf(&configapi.EndpointPickerConfig{Plugins: tc.plugins})
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v, error %q", tc.name, got, err, tc.want, tc.err)
		}
	}
}
