package main

import (
	"context"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common"

	"github.com/sluice-gw/sluice/crds/rewritecontroller"
	"github.com/sluice-gw/sluice/modelrewrite"
	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/runner"
)

// modelRewrites wires InferenceModelRewrite splitting into the EPP: the
// runner's model selector in both modes, and, in Kubernetes mode, the
// reconciler that puts the pool's rewrites in force and writes their status.
// Nothing is installed when the EPP serves an --endpoint-selector Deployment
// (no InferencePool for rewrites to reference).
type modelRewrites struct {
	cmd *plugins.ModelRewriteCommand
	// started is set by the selector factory, which the runner calls before
	// the manager setups.
	started *plugins.ModelRewrite
}

func (m *modelRewrites) selector(ctx context.Context, deps runner.ModelSelectorDeps) (runner.ModelSelector, error) {
	if deps.Pool.Kind != modelrewrite.PoolKind {
		return nil, nil
	}
	rw, err := m.cmd.Start(ctx, plugins.ModelRewriteEnv{
		Pool:           poolKey(deps.Pool),
		StaticMode:     deps.Options.StaticMode(),
		ReloadInterval: deps.Options.StaticEndpointsReloadInterval,
		Registerer:     metrics.Registry, // what the EPP's /metrics serves
		Logger:         deps.Logger,
	})
	if err != nil {
		return nil, err
	}
	m.started = rw
	return rewriteSelector{rw: rw, served: m.cmd.ResponsesNameServedModel(), logger: deps.Logger}, nil
}

func (m *modelRewrites) managerSetup() runner.ManagerSetup {
	return runner.ManagerSetup{
		Setup: func(mgr manager.Manager, pool common.GKNN) error {
			if m.started == nil {
				return nil
			}
			return rewritecontroller.Setup(mgr, poolKey(pool), m.started, rewritecontroller.Options{
				DiscoveryInterval: m.cmd.CRDCheckInterval(),
				TripEvents:        m.cmd.TripEvents(),
				Logger:            ctrl.Log.WithName("inferencemodelrewrite"),
			})
		},
	}
}

func poolKey(pool common.GKNN) modelrewrite.PoolKey {
	return modelrewrite.PoolKey{Namespace: pool.Namespace, Group: pool.Group, Name: pool.Name}
}

// rewriteSelector adapts plugins.ModelRewrite to the runner's seam. By
// default it names the chosen model in upstream's rewrite header, so the
// client sees the model it asked for; with served it writes the model into
// the body, so upstream treats it as the client's and responses name it.
type rewriteSelector struct {
	rw     *plugins.ModelRewrite
	served bool
	logger logr.Logger
}

func (s rewriteSelector) SelectModel(_ context.Context, headers map[string]string, body []byte) runner.ModelChoice {
	d, rewritten := s.rw.Choose(headers, body)
	if !rewritten {
		return runner.ModelChoice{}
	}
	choice := runner.ModelChoice{Model: d.Model, Done: func(o runner.ResponseOutcome) {
		s.rw.Finish(d, plugins.RequestOutcome(o))
	}}
	if s.served {
		if b, err := plugins.ReplaceModel(body, d.Model); err != nil {
			s.logger.Error(err, "Naming the served model in the request body; the response names the requested one")
		} else {
			choice.Model, choice.Body = "", b
		}
	}
	return choice
}
