package hotinstall

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// DefaultInterval is how often Start looks for the CRD while the objects cannot be watched.
const DefaultInterval = 10 * time.Second

// Watch describes the objects a reconciler watches and how to talk about waiting for them.
type Watch struct {
	// GVK is the objects' kind; List is an empty list of that kind, registered in the manager's scheme.
	GVK  schema.GroupVersionKind
	List client.ObjectList
	// Namespace is the only namespace watched.
	Namespace string
	// Absent is logged once when the CRD is not installed at start, e.g. "model rewrites start once it is".
	Absent string
	// RBAC names the manifest that grants the EPP the permissions, for the error that says it lacks them.
	RBAC string
	// Interval is how often to look while the objects cannot be watched; 0 means DefaultInterval.
	Interval time.Duration
	Logger   logr.Logger
}

// Start calls start with a cache of w.Namespace's objects once the API server serves w.GVK and the EPP may list
// them there: at once when it can, otherwise from a runnable added to mgr that checks every w.Interval, so
// installing the CRD (or granting the RBAC) later needs no restart. The cache is added to mgr first and starts with
// it (at once when mgr is already running); start adds the reconciler's watches on it.
func Start(mgr manager.Manager, w Watch, start func(cache.Cache) error) error {
	if w.List == nil || w.Namespace == "" {
		return errors.New("hotinstall: a list type and a namespace are required")
	}
	if w.Interval <= 0 {
		w.Interval = DefaultInterval
	}
	dc, err := discovery.NewDiscoveryClientForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("watching %s: %w", w.GVK.Kind, err)
	}
	// usable reports whether the CRD is installed and the EPP may list the namespace's objects; a cache that
	// cannot list would never sync and would stop the manager, so the reconciler waits for both.
	usable := func(ctx context.Context) (bool, error) {
		installed, err := served(dc, w.GVK)
		if err != nil || !installed {
			return false, err
		}
		err = mgr.GetAPIReader().List(ctx, w.List, client.InNamespace(w.Namespace), client.Limit(1))
		if apierrors.IsForbidden(err) {
			return false, fmt.Errorf("the EPP may not list %ss in %s (see %s): %w", w.GVK.Kind, w.Namespace, w.RBAC, err)
		}
		return err == nil, err
	}
	begin := func() error {
		c, err := cache.New(mgr.GetConfig(), cache.Options{
			Scheme:            mgr.GetScheme(),
			Mapper:            mgr.GetRESTMapper(),
			DefaultNamespaces: map[string]cache.Config{w.Namespace: {}},
		})
		if err != nil {
			return fmt.Errorf("watching %s: %w", w.GVK.Kind, err)
		}
		if err := mgr.Add(c); err != nil {
			return err
		}
		return start(c)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	ok, err := usable(ctx)
	cancel()
	if ok {
		return begin()
	}
	if err != nil {
		w.Logger.Error(err, "Waiting to watch "+w.GVK.Kind+"s", "checkEvery", w.Interval)
	} else {
		w.Logger.Info(fmt.Sprintf("The %s CRD is not installed; %s", w.GVK.Kind, w.Absent), "checkEvery", w.Interval)
	}
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		t := time.NewTicker(w.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
			ok, err := usable(ctx)
			if err != nil {
				w.Logger.Error(err, "Waiting to watch "+w.GVK.Kind+"s")
				continue
			}
			if ok {
				w.Logger.Info(w.GVK.Kind + "s can be watched: starting")
				return begin()
			}
		}
	}))
}

// served reports whether the API server serves gvk.
func served(dc discovery.DiscoveryInterface, gvk schema.GroupVersionKind) (bool, error) {
	list, err := dc.ServerResourcesForGroupVersion(gvk.GroupVersion().String())
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	for _, r := range list.APIResources {
		if r.Kind == gvk.Kind {
			return true, nil
		}
	}
	return false, nil
}
