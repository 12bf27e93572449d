package virtualbench

import (
	"encoding/json"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configapi "sigs.k8s.io/gateway-api-inference-extension/apix/config/v1alpha1"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization"
)

// Upstream's utilization saturation detector (the default saturation detector, and a scheduling filter when
// configured as one) treats an endpoint whose metrics are older than its metricsStalenessThreshold as saturated, and
// it measures their age with time.Since(UpdateTime): on the wall clock. In virtual time the metrics' age is on the
// EPP's clock, so the EPP classifies them itself, with the detector's threshold, and shows the detector an UpdateTime
// whose wall-clock age falls on the same side of the threshold whatever the wall clock reads: a time far in the
// future for fresh metrics, the zero time (as for metrics never scraped) for stale ones. No other upstream v1.5.0
// code reads UpdateTime, and Sluice's admission judges staleness on its injected clock.

// freshUpdateTime is an UpdateTime that time.Since reports as negative, hence fresh for any threshold.
var freshUpdateTime = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// staleness is the staleness rule of the configured utilization detectors. The zero value (no detector) shows
// UpdateTime unchanged: nothing upstream reads it then.
type staleness struct {
	threshold time.Duration
	checked   bool
}

// stalenessOf finds the utilization detectors of a loaded configuration (after upstream's loader added its default
// one) and their metricsStalenessThreshold. Detectors with different thresholds cannot share one view of the
// metrics: that configuration is refused.
func stalenessOf(raw *configapi.EndpointPickerConfig) (staleness, error) {
	var s staleness
	for _, spec := range raw.Plugins {
		if spec.Type != utilization.UtilizationDetectorType {
			continue
		}
		params := struct {
			MetricsStalenessThreshold *metav1.Duration `json:"metricsStalenessThreshold"`
		}{}
		if len(spec.Parameters) > 0 {
			if err := json.Unmarshal(spec.Parameters, &params); err != nil {
				return staleness{}, fmt.Errorf("plugin %q: %w", spec.Name, err)
			}
		}
		threshold := utilization.DefaultMetricsStalenessThreshold
		if params.MetricsStalenessThreshold != nil {
			threshold = params.MetricsStalenessThreshold.Duration
		}
		if s.checked && threshold != s.threshold {
			return staleness{}, fmt.Errorf("utilization detectors with different metricsStalenessThresholds (%v, %v) "+
				"are not supported in process", s.threshold, threshold)
		}
		s = staleness{threshold: threshold, checked: true}
	}
	return s, nil
}

// updateTime returns the UpdateTime upstream's detector is shown for metrics stamped t (on the EPP's clock) at now:
// fresh while they are at most the threshold old, as the detector decides.
func (s staleness) updateTime(t, now time.Time) time.Time {
	switch {
	case !s.checked || t.IsZero():
		return t
	case now.Sub(t) > s.threshold:
		return time.Time{}
	default:
		return freshUpdateTime
	}
}
