package rewritecontroller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/sluice-gw/sluice/crds/internal/hotinstall"
	"github.com/sluice-gw/sluice/crds/internal/poolmeta"
	"github.com/sluice-gw/sluice/modelrewrite"
)

// DefaultDiscoveryInterval is how often Setup looks for the
// InferenceModelRewrite CRD while it is not installed.
const DefaultDiscoveryInterval = hotinstall.DefaultInterval

// Target is what the reconciler feeds: the EPP's model selection
// (plugins.ModelRewrite implements it).
type Target interface {
	// SetTable puts the rules in force.
	SetTable(*modelrewrite.Table)
	// Trips lists the guardrail's tripped targets (nil without a guardrail).
	Trips() []modelrewrite.Trip
	// ClearGuardrails honours changed ClearGuardrailAnnotation values, given
	// every current object's value, and returns the trips it cleared.
	ClearGuardrails(tokens map[modelrewrite.ObjectKey]string) []modelrewrite.Trip
}

// Options configures Setup.
type Options struct {
	// DiscoveryInterval is how often to look for the CRD while it is not
	// installed; 0 means DefaultDiscoveryInterval.
	DiscoveryInterval time.Duration
	// TripEvents (may be nil) signals that a guardrail tripped, so the
	// status saying so is written at once.
	TripEvents <-chan struct{}
	Logger     logr.Logger
}

// rewriteGVK is the API the reconciler serves.
var rewriteGVK = schema.GroupVersionKind{Group: v1alpha2.GroupVersion.Group, Version: v1alpha2.GroupVersion.Version, Kind: "InferenceModelRewrite"}

// Setup adds the reconciler of pool's InferenceModelRewrites to mgr. When
// the CRD is installed (and the EPP may list the rewrites) it is set up at
// once; otherwise a runnable checks every DiscoveryInterval and sets the
// reconciler up as soon as it can, so installing the CRD (or granting the
// RBAC) needs no restart (package hotinstall). Like the manager's other
// controllers it runs on the leader only (every replica while leader
// election is off).
func Setup(mgr manager.Manager, pool modelrewrite.PoolKey, target Target, opts Options) error {
	if target == nil {
		return errors.New("inferencemodelrewrite controller: target is nil")
	}
	if pool.Namespace == "" || pool.Name == "" {
		return fmt.Errorf("inferencemodelrewrite controller: pool namespace and name are required, got %q/%q", pool.Namespace, pool.Name)
	}
	if pool.Group == "" {
		pool.Group = modelrewrite.DefaultPoolGroup
	}
	mapping, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: pool.Group, Kind: modelrewrite.PoolKind})
	if err != nil {
		return fmt.Errorf("inferencemodelrewrite controller: resolving %s.%s (is its CRD installed?): %w", modelrewrite.PoolKind, pool.Group, err)
	}
	r := &Reconciler{writer: mgr.GetClient(), pool: pool, poolGVK: mapping.GroupVersionKind, target: target, logger: opts.Logger}
	return hotinstall.Start(mgr, hotinstall.Watch{
		GVK:       rewriteGVK,
		List:      &v1alpha2.InferenceModelRewriteList{},
		Namespace: pool.Namespace,
		Absent:    "model rewrites start once it is",
		RBAC:      "examples/modelrewrite-rbac.yaml",
		Interval:  opts.DiscoveryInterval,
		Logger:    opts.Logger,
	}, func(rewrites cache.Cache) error { return r.start(mgr, rewrites, opts.TripEvents) })
}

// Reconciler keeps one pool's InferenceModelRewrites in force and writes
// their status.
type Reconciler struct {
	// reader lists rewrites (a cache of the pool's namespace); writer reads
	// the pool and writes statuses.
	reader  client.Reader
	writer  client.Client
	pool    modelrewrite.PoolKey
	poolGVK schema.GroupVersionKind
	target  Target
	logger  logr.Logger

	// mu serialises reconciles, which recompute everything.
	mu sync.Mutex
}

var _ reconcile.Reconciler = (*Reconciler)(nil)

// start adds the controller, reading rewrites from the cache of the pool's
// namespace, to mgr; it starts at once when mgr is already running.
func (r *Reconciler) start(mgr manager.Manager, rewrites cache.Cache, trips <-chan struct{}) error {
	r.reader = rewrites

	key := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: r.pool.Namespace, Name: r.pool.Name}}
	toPool := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{key}
	})
	mine := func(o client.Object) bool {
		rw, ok := o.(*v1alpha2.InferenceModelRewrite)
		return ok && owns(r.pool, rw)
	}
	// An update matters when the object was or is the pool's.
	ofPool := predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return mine(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return mine(e.ObjectOld) || mine(e.ObjectNew) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return mine(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return mine(e.Object) },
	}
	isPool := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == r.pool.Namespace && o.GetName() == r.pool.Name
	})
	// Only the pool's existence matters; its frequent status updates do not.
	existenceOnly := predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }}
	poolMeta := &metav1.PartialObjectMetadata{}
	poolMeta.SetGroupVersionKind(r.poolGVK)

	b := builder.ControllerManagedBy(mgr).
		Named("sluice-inferencemodelrewrite").
		WatchesRawSource(source.Kind(rewrites, client.Object(&v1alpha2.InferenceModelRewrite{}), toPool, predicate.Predicate(ofPool))).
		WatchesMetadata(poolMeta, toPool, builder.WithPredicates(isPool, existenceOnly))
	if trips != nil {
		b = b.WatchesRawSource(source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			go func() {
				for {
					select {
					case <-ctx.Done():
						return
					case <-trips:
						q.Add(key)
					}
				}
			}()
			return nil
		}))
	}
	return b.Complete(r)
}

// Reconcile recomputes the rules in force for the pool, whatever the
// request, honours changed clear-guardrail annotations and writes the
// statuses that changed. Failed status writes are returned, and retried,
// together.
func (r *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()

	var list v1alpha2.InferenceModelRewriteList
	if err := r.reader.List(ctx, &list, client.InNamespace(r.pool.Namespace)); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing InferenceModelRewrites in %s: %w", r.pool.Namespace, err)
	}
	poolFound, err := r.poolExists(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	tokens := map[modelrewrite.ObjectKey]string{}
	for i := range list.Items {
		if obj := &list.Items[i]; owns(r.pool, obj) {
			tokens[modelrewrite.ObjectKey{Namespace: obj.Namespace, Name: obj.Name}] = obj.Annotations[modelrewrite.ClearGuardrailAnnotation]
		}
	}
	for _, t := range r.target.ClearGuardrails(tokens) {
		r.logger.Info("Model rewrite guardrail cleared by annotation", "rule", t.Rule.String(), "target", t.Target)
	}
	table, verdicts, err := decide(r.pool, list.Items, poolFound, r.target.Trips())
	if err != nil {
		r.logger.Error(err, "Some InferenceModelRewrites are left out of the rules in force")
	}
	r.target.SetTable(table)
	var errs []error
	for _, v := range verdicts {
		errs = append(errs, r.writeStatus(ctx, v))
	}
	return reconcile.Result{}, errors.Join(errs...)
}

func (r *Reconciler) poolExists(ctx context.Context) (bool, error) {
	return poolmeta.Exists(ctx, r.writer, r.poolGVK, types.NamespacedName{Namespace: r.pool.Namespace, Name: r.pool.Name})
}

// writeStatus sets the verdict's conditions and writes them if they changed.
func (r *Reconciler) writeStatus(ctx context.Context, v verdict) error {
	obj := v.obj.DeepCopy()
	for _, c := range v.conditions {
		meta.SetStatusCondition(&obj.Status.Conditions, c)
	}
	if equality.Semantic.DeepEqual(obj.Status, v.obj.Status) {
		return nil
	}
	if err := r.writer.Status().Update(ctx, obj); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("updating status of InferenceModelRewrite %s/%s: %w", obj.Namespace, obj.Name, err)
	}
	return nil
}
