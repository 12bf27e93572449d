package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/sluice-gw/sluice/crds"
	"github.com/sluice-gw/sluice/crds/internal/hotinstall"
	"github.com/sluice-gw/sluice/crds/internal/poolmeta"
	"github.com/sluice-gw/sluice/flowcontrol"
)

const (
	// DefaultPoolGroup is the InferencePool group a Pool with an empty Group means, as for a poolRef.
	DefaultPoolGroup = "inference.networking.k8s.io"
	poolKind         = "InferencePool"
	// maxMessageLen is metav1.Condition's limit on Message.
	maxMessageLen = 32768
)

// Pool identifies the InferencePool an EPP serves.
type Pool struct {
	// Group is the pool's API group; empty means DefaultPoolGroup.
	Group     string
	Namespace string
	Name      string
}

func (p Pool) group() string { return cmp.Or(p.Group, DefaultPoolGroup) }

func (p Pool) String() string { return p.Namespace + "/" + p.Name }

// references reports whether ref names the pool. Empty group and kind take the schema's defaults, so objects
// stored before defaulting match too.
func (p Pool) references(ref crds.PoolReference) bool {
	return cmp.Or(ref.Group, DefaultPoolGroup) == p.group() && cmp.Or(ref.Kind, poolKind) == poolKind && ref.Name == p.Name
}

// Reconciler keeps the FlowControlPolicy statuses of one pool and hands the configuration in force to a callback.
type Reconciler struct {
	// client reads the pool and writes statuses; reader lists the policies (a cache of the pool's namespace, set by
	// SetupWithManager once the CRD is served).
	client client.Client
	reader client.Reader
	pool   Pool
	apply  func(*flowcontrol.Config)

	mu sync.Mutex
	// poolGVK is resolved once by SetupWithManager.
	poolGVK schema.GroupVersionKind
	// applied is the configuration last handed to apply; nil before the first reconcile.
	applied *flowcontrol.Config
}

var _ reconcile.Reconciler = (*Reconciler)(nil)

// New returns a Reconciler for pool that calls apply with each new configuration in force. c should be the
// manager's client, whose cache must cover InferencePools in the pool's namespace.
func New(c client.Client, pool Pool, apply func(*flowcontrol.Config)) (*Reconciler, error) {
	var errs []error
	if c == nil {
		errs = append(errs, errors.New("client is nil"))
	}
	if pool.Namespace == "" || pool.Name == "" {
		errs = append(errs, fmt.Errorf("pool namespace and name are required, got %q/%q", pool.Namespace, pool.Name))
	}
	if apply == nil {
		errs = append(errs, errors.New("apply callback is nil"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("flowcontrolpolicy controller: %w", err)
	}
	return &Reconciler{client: c, pool: pool, apply: apply}, nil
}

// Options configures SetupWithManager.
type Options struct {
	// DiscoveryInterval is how often to look for the FlowControlPolicy CRD while it is not installed; 0 means
	// hotinstall.DefaultInterval.
	DiscoveryInterval time.Duration
	Logger            logr.Logger
}

// SetupWithManager registers the reconciler: at once when the FlowControlPolicy CRD is installed (and the EPP may
// list policies), otherwise as soon as it is, without a restart; until then no configuration is handed to the
// callback, so whatever the EPP started with stays in force. Every FlowControlPolicy event in the pool's namespace,
// and the pool's creation and deletion, enqueue the same request: the pool.
func (r *Reconciler) SetupWithManager(mgr manager.Manager, opts Options) error {
	mapping, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: r.pool.group(), Kind: poolKind})
	if err != nil {
		return fmt.Errorf("flowcontrolpolicy controller: resolving %s.%s (is its CRD installed?): %w", poolKind, r.pool.group(), err)
	}
	r.mu.Lock()
	r.poolGVK = mapping.GroupVersionKind
	r.mu.Unlock()
	return hotinstall.Start(mgr, hotinstall.Watch{
		GVK:       crds.GroupVersion.WithKind("FlowControlPolicy"),
		List:      &crds.FlowControlPolicyList{},
		Namespace: r.pool.Namespace,
		Absent:    "Sluice admission keeps the policy it started with until one is installed and accepted",
		RBAC:      "examples/flowcontrolpolicy-rbac.yaml",
		Interval:  opts.DiscoveryInterval,
		Logger:    opts.Logger,
	}, func(policies cache.Cache) error { return r.start(mgr, policies) })
}

// start adds the controller, reading policies from the cache of the pool's namespace, to mgr; it starts at once
// when mgr is already running.
func (r *Reconciler) start(mgr manager.Manager, policies cache.Cache) error {
	r.mu.Lock()
	r.reader = policies
	r.mu.Unlock()
	poolMeta := &metav1.PartialObjectMetadata{}
	poolMeta.SetGroupVersionKind(r.poolGVK)

	key := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: r.pool.Namespace, Name: r.pool.Name}}
	toPool := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{key}
	})
	isPool := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == r.pool.Namespace && o.GetName() == r.pool.Name
	})
	// Only the pool's existence matters; its frequent status updates do not.
	existenceOnly := predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }}
	return builder.ControllerManagedBy(mgr).
		Named("flowcontrolpolicy").
		WatchesRawSource(source.Kind(policies, client.Object(&crds.FlowControlPolicy{}), toPool)).
		WatchesMetadata(poolMeta, toPool, builder.WithPredicates(isPool, existenceOnly)).
		Complete(r)
}

// Reconcile recomputes the decision for the pool, whatever the request, hands a changed configuration in force to
// the callback and writes the statuses that changed. Failed status writes are returned, and retried, together.
func (r *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()

	var list crds.FlowControlPolicyList
	if r.reader == nil {
		return reconcile.Result{}, errors.New("flowcontrolpolicy controller: SetupWithManager has not started it")
	}
	if err := r.reader.List(ctx, &list, client.InNamespace(r.pool.Namespace)); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing FlowControlPolicies in %s: %w", r.pool.Namespace, err)
	}
	poolFound, err := r.poolExistsLocked(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	inForce, verdicts := decide(r.pool, list.Items, poolFound)
	if r.applied == nil || !reflect.DeepEqual(inForce, r.applied) {
		r.apply(inForce)
		r.applied = inForce
	}
	var errs []error
	for _, v := range verdicts {
		errs = append(errs, r.writeStatus(ctx, v))
	}
	return reconcile.Result{}, errors.Join(errs...)
}

func (r *Reconciler) poolExistsLocked(ctx context.Context) (bool, error) {
	if r.poolGVK.Empty() {
		return false, errors.New("flowcontrolpolicy controller: SetupWithManager was not called")
	}
	return poolmeta.Exists(ctx, r.client, r.poolGVK, types.NamespacedName{Namespace: r.pool.Namespace, Name: r.pool.Name})
}

// writeStatus sets the verdict's condition and observedGeneration, and writes them if they changed.
func (r *Reconciler) writeStatus(ctx context.Context, v verdict) error {
	p := v.policy.DeepCopy()
	meta.SetStatusCondition(&p.Status.Conditions, v.condition)
	p.Status.ObservedGeneration = p.Generation
	if equality.Semantic.DeepEqual(p.Status, v.policy.Status) {
		return nil
	}
	if err := r.client.Status().Update(ctx, p); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("updating status of FlowControlPolicy %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// verdict is the Accepted condition one policy should have.
type verdict struct {
	policy    *crds.FlowControlPolicy
	condition metav1.Condition
}

// decide returns the configuration in force for pool and a verdict for each of its policies (see the package
// documentation for the rules). It only reads policies.
func decide(pool Pool, policies []crds.FlowControlPolicy, poolFound bool) (*flowcontrol.Config, []verdict) {
	var mine []*crds.FlowControlPolicy
	for i := range policies {
		p := &policies[i]
		if p.DeletionTimestamp == nil && pool.references(p.Spec.PoolRef) {
			mine = append(mine, p)
		}
	}
	slices.SortFunc(mine, func(a, b *crds.FlowControlPolicy) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})

	var inForce *flowcontrol.Config
	var winner string
	verdicts := make([]verdict, 0, len(mine))
	for _, p := range mine {
		cond := metav1.Condition{Type: crds.ConditionAccepted, Status: metav1.ConditionFalse, ObservedGeneration: p.Generation}
		if !poolFound {
			cond.Reason = crds.ReasonPoolNotFound
			cond.Message = fmt.Sprintf("%s %s not found", poolKind, pool)
		} else if cfg, err := p.Spec.ToConfig(); err != nil {
			cond.Reason = crds.ReasonInvalidSpec
			cond.Message = truncate(err.Error(), maxMessageLen)
		} else if inForce != nil {
			cond.Reason = crds.ReasonConflicted
			cond.Message = fmt.Sprintf("FlowControlPolicy %s is older and in force for %s %s", winner, poolKind, pool)
		} else {
			inForce, winner = cfg, p.Name
			cond.Status = metav1.ConditionTrue
			cond.Reason = crds.ReasonAccepted
			cond.Message = fmt.Sprintf("in force for %s %s", poolKind, pool)
		}
		verdicts = append(verdicts, verdict{policy: p, condition: cond})
	}
	if inForce == nil {
		inForce = flowcontrol.DefaultConfig()
	}
	return inForce, verdicts
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "..."
	cut := n - len(ellipsis)
	for cut > 0 && s[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
		cut--
	}
	return s[:cut] + ellipsis
}
