// Command epp is the Sluice Endpoint Picker: a drop-in replacement for the
// Gateway API Inference Extension v1.5.0 EPP image. Run it with --help for its
// flags; every upstream flag and environment variable works unchanged.
//
// Sluice admission (priority bands, queued admission, 429/503 with
// Retry-After) is off unless --sluice-admission or --flow-control-config is
// given; until then the EPP admits requests exactly as upstream's does.
//
// Where the admission policy comes from:
//
//   - --flow-control-config, in any mode: the file, read once at startup.
//   - Kubernetes mode with --pool-name and no --flow-control-config: the
//     FlowControlPolicy (sluice.dev/v1alpha1) accepted for the pool, applied
//     live as it changes, or the defaults while none is accepted. The EPP then
//     needs the RBAC of examples/flowcontrolpolicy-rbac.yaml. If the
//     FlowControlPolicy CRD is not installed, the EPP logs it once, runs on the
//     defaults, and applies policies once the CRD is installed (no restart).
//   - Otherwise (static mode, --endpoint-selector): the defaults.
//
// InferenceModelRewrites (upstream's API) are applied by Sluice with sticky
// sessions, exact precedence, status conditions, per-target metrics and an
// opt-in guardrail (--model-rewrite-*): in Kubernetes mode from the API
// server, live, also when the CRD is installed after the EPP started (RBAC:
// examples/modelrewrite-rbac.yaml); in static mode from --model-rewrites-file.
package main

import (
	"context"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"

	"github.com/sluice-gw/sluice/crds"
	policycontroller "github.com/sluice-gw/sluice/crds/controller"
	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/runner"
)

// Sluice admission is a runnable: the runner runs it beside the EPP's servers and waits for it on shutdown, so the
// requests still waiting in it are answered before the process exits.
var _ manager.Runnable = (*plugins.FlowControl)(nil)

// Sluice admission's rejections are designed shedding: the runner keeps upstream's error lines for them out of the log.
var _ runner.Shedder = (*plugins.FlowControlCommand)(nil)

func main() {
	if err := newRunner().Run(ctrl.SetupSignalHandler(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "epp:", err)
		os.Exit(1)
	}
}

// newRunner is the Sluice EPP: upstream's, assembled by the runner, with Sluice admission, its policies, and model
// rewrites. Run it once per process (it registers metrics on the process-wide registry).
func newRunner() *runner.Runner {
	admission := plugins.NewFlowControlCommand()
	rewrites := &modelRewrites{cmd: plugins.NewModelRewriteCommand()}
	return runner.New().
		WithFlags(admission.AddFlags, func(opts *runner.Options) error { return admission.Complete(opts.Options) }).
		WithFlags(rewrites.cmd.AddFlags, func(opts *runner.Options) error { return rewrites.cmd.Complete(opts.StaticMode()) }).
		WithModelSelector(rewrites.selector).
		WithAdmission(func(ctx context.Context, deps runner.AdmissionDeps) (requestcontrol.AdmissionController, error) {
			if !admission.Enabled() {
				if deps.Replication != nil {
					return nil, fmt.Errorf("--peers, --peers-file and --peers-service share the endpoints through Sluice admission: add --sluice-admission")
				}
				return runner.UpstreamAdmission(ctx, deps)
			}
			env := plugins.FlowControlEnv{
				Endpoints:       deps.Datastore,
				Plugins:         deps.Plugins,
				RefreshInterval: deps.Options.RefreshMetricsInterval,
				Registerer:      metrics.Registry, // what the EPP's /metrics serves
				Logger:          deps.Logger.WithName("flow-control"),
			}
			if deps.Replication != nil {
				env.Ownership = deps.Replication
				env.Peers = deps.PeerExchange
			}
			return admission.Start(ctx, env)
		}).
		WithResponseShapers(admission).
		WithHotPath(func(*runner.Options) bool { return admission.Enabled() }).
		WithManagerSetup(policySetup(admission)).
		WithManagerSetup(rewrites.managerSetup())
}

// policySetup watches the FlowControlPolicies of the EPP's InferencePool and applies the one in force to Sluice
// admission live. It does nothing unless Sluice admission is on without a policy file and the EPP serves an
// InferencePool (not an --endpoint-selector Deployment).
func policySetup(admission *plugins.FlowControlCommand) runner.ManagerSetup {
	watched := func(pool common.GKNN) bool {
		return admission.Enabled() && admission.PolicyFile() == "" && pool.Kind == "InferencePool"
	}
	logger := ctrl.Log.WithName("flowcontrolpolicy")
	return runner.ManagerSetup{
		Options: func(opts *ctrl.Options, pool common.GKNN) error {
			if !watched(pool) {
				return nil
			}
			// Policies are read through a cache of their own, created once the CRD is served (the manager's cache
			// cannot name a type the API server may not have); the scheme only has to know the types.
			if err := crds.AddToScheme(opts.Scheme); err != nil {
				return fmt.Errorf("registering %s types: %w", crds.GroupVersion, err)
			}
			return nil
		},
		Setup: func(mgr manager.Manager, pool common.GKNN) error {
			if !watched(pool) {
				if admission.Enabled() && admission.PolicyFile() != "" {
					logger.Info("FlowControlPolicies are not watched: --flow-control-config is in force", "file", admission.PolicyFile())
				}
				return nil
			}
			rec, err := policycontroller.New(mgr.GetClient(),
				policycontroller.Pool{Group: pool.Group, Namespace: pool.Namespace, Name: pool.Name},
				func(cfg *flowcontrol.Config) {
					if err := admission.Apply(cfg); err != nil {
						logger.Error(err, "Applying the flow control policy in force")
						return
					}
					logger.Info("Flow control policy applied", "pool", pool.NamespacedName)
				})
			if err != nil {
				return err
			}
			return rec.SetupWithManager(mgr, policycontroller.Options{Logger: logger})
		},
	}
}
