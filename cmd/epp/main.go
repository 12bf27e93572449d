// Command epp is the Sluice Endpoint Picker: a drop-in replacement for the
// Gateway API Inference Extension v1.5.0 EPP image. Run it with --help for its
// flags; every upstream flag and environment variable works unchanged.
//
// Sluice admission (priority bands, queued admission, 429/503 with
// Retry-After) is off unless --sluice-admission or --flow-control-config is
// given; until then the EPP admits requests exactly as upstream's does.
package main

import (
	"context"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"

	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/runner"
)

func main() {
	admission := plugins.NewFlowControlCommand()
	r := runner.New().
		WithFlags(admission.AddFlags, func(opts *runner.Options) error { return admission.Complete(opts.Options) }).
		WithAdmission(func(ctx context.Context, deps runner.AdmissionDeps) (requestcontrol.AdmissionController, error) {
			if !admission.Enabled() {
				return runner.UpstreamAdmission(ctx, deps)
			}
			return admission.Start(ctx, plugins.FlowControlEnv{
				Endpoints:       deps.Datastore,
				Plugins:         deps.Plugins,
				RefreshInterval: deps.Options.RefreshMetricsInterval,
				Registerer:      metrics.Registry, // what the EPP's /metrics serves
				Logger:          deps.Logger.WithName("flow-control"),
			})
		}).
		WithResponseShapers(admission)
	if err := r.Run(ctrl.SetupSignalHandler(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "epp:", err)
		os.Exit(1)
	}
}
