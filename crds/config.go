package crds

import (
	"errors"
	"fmt"

	"github.com/sluice-gw/sluice/flowcontrol"
)

// ToConfig converts the spec into the validated flow control configuration it describes: unset fields take
// flowcontrol's defaults, then everything is validated, and all violations are reported together. It enforces every
// rule of the CRD schema even though the API server already does, because a stored object may predate the current
// schema. The spec is not modified.
func (s *FlowControlPolicySpec) ToConfig() (*flowcontrol.Config, error) {
	api := s.apiConfig()
	// The one rule stricter than flowcontrol's: the CRD bounds ceilings by 1, the endpoint thresholds themselves,
	// so that a policy cannot dispatch to endpoints its own thresholds call saturated.
	var errs []error
	for _, b := range []struct {
		name    string
		ceiling *float64
	}{
		{"critical", ceilingOf(api.Bands.Critical)},
		{"standard", ceilingOf(api.Bands.Standard)},
		{"sheddable", ceilingOf(api.Bands.Sheddable)},
	} {
		if b.ceiling != nil && *b.ceiling > 1 {
			errs = append(errs, fmt.Errorf("invalid flow control configuration: bands.%s.saturationCeiling must be in (0, 1], got %v",
				b.name, *b.ceiling))
		}
	}
	cfg, err := flowcontrol.NewConfig(api)
	if err := errors.Join(append([]error{err}, errs...)...); err != nil {
		return nil, err
	}
	return cfg, nil
}

// apiConfig returns the flowcontrol.APIConfig the spec mirrors. Nested values are shared with s, which is safe
// because flowcontrol.NewConfig does not modify its argument.
func (s *FlowControlPolicySpec) apiConfig() *flowcontrol.APIConfig {
	api := &flowcontrol.APIConfig{
		Bands:             &flowcontrol.APIBands{},
		MaxQueuedRequests: s.MaxQueuedRequests,
		MaxQueuedBytes:    s.MaxQueuedBytes,
		PriorityMapping:   (*flowcontrol.APIPriorityMapping)(s.PriorityMapping),
		Endpoint:          (*flowcontrol.APIEndpointThresholds)(s.Endpoint),
		RetryAfterJitter:  s.RetryAfterJitter,
		DrainRateWindow:   s.DrainRateWindow,
		TenantHeader:      s.TenantHeader,
		AboveMaxBand:      s.AboveMaxBand,
	}
	if s.Bands != nil {
		api.Bands.Critical = (*flowcontrol.APIBandConfig)(s.Bands.Critical)
		api.Bands.Standard = (*flowcontrol.APIBandConfig)(s.Bands.Standard)
		api.Bands.Sheddable = (*flowcontrol.APIBandConfig)(s.Bands.Sheddable)
	}
	for _, t := range s.Tenants {
		api.Tenants = append(api.Tenants, flowcontrol.APITenantPolicy(t))
	}
	if s.DefaultTenant != nil {
		api.DefaultTenant = &flowcontrol.APITenantPolicy{Weight: s.DefaultTenant.Weight, MaxBand: s.DefaultTenant.MaxBand}
	}
	return api
}

func ceilingOf(b *flowcontrol.APIBandConfig) *float64 {
	if b == nil {
		return nil
	}
	return b.SaturationCeiling
}
