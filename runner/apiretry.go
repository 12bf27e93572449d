package runner

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
	ctrl "sigs.k8s.io/controller-runtime"
)

// apiRetryInterval is how often the manager's informers try the API server again while they cannot reach it.
const apiRetryInterval = 200 * time.Millisecond

// promptInformers makes the manager's informers resume within apiRetryInterval of the API server's return.
//
// Left to itself, client-go's reflector answers a list or watch the API server refused with an exponential back-off
// (0.8 s doubling to 30 s, plus up to as much again of jitter) that only resets after 2 minutes. After an outage of
// 10-20 s its next attempt is 6-50 s after the API server is back, and all that time the EPP's cache, and so its
// pods, miss every change: a pod deleted then keeps its traffic. Connecting to an API server that is not there
// costs it nothing, so the informers retry at a short fixed interval instead; other errors (429, a watch that
// expired) still reach the reflector and its back-off.
func promptInformers(o *ctrl.Options) {
	if o.Cache.NewInformer != nil {
		return
	}
	o.Cache.NewInformer = func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
		return toolscache.NewSharedIndexInformer(&retryUnreachable{lw: toolscache.ToListerWatcherWithContext(lw), semantics: lw, every: apiRetryInterval},
			obj, resync, indexers)
	}
}

// retryUnreachable is a ListerWatcher that repeats a list or watch every interval while the API server cannot be
// reached, until it is reached or ctx ends.
type retryUnreachable struct {
	lw        toolscache.ListerWatcherWithContext
	semantics any // the ListerWatcher given, which may declare its WatchList semantics
	every     time.Duration
}

// unreachable tells the errors of an API server that is down, restarting or cut off (refused or dropped
// connections) from its answers.
func unreachable(err error) bool {
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err)
}

func (r *retryUnreachable) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return retry(ctx, r.every, func() (runtime.Object, error) { return r.lw.ListWithContext(ctx, opts) })
}

func (r *retryUnreachable) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return retry(ctx, r.every, func() (watch.Interface, error) { return r.lw.WatchWithContext(ctx, opts) })
}

// List and Watch serve callers without a context (the reflector uses the methods above).
func (r *retryUnreachable) List(opts metav1.ListOptions) (runtime.Object, error) {
	return r.ListWithContext(context.Background(), opts)
}

func (r *retryUnreachable) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return r.WatchWithContext(context.Background(), opts)
}

// IsWatchListSemanticsUnSupported passes on what the wrapped ListerWatcher declares, so the reflector uses
// WatchList exactly when it would without the wrapper.
func (r *retryUnreachable) IsWatchListSemanticsUnSupported() bool {
	return watchlist.DoesClientNotSupportWatchListSemantics(r.semantics)
}

// retry calls try until it returns something other than an unreachable API server's error, every interval; when ctx
// ends it returns try's last answer.
func retry[T any](ctx context.Context, every time.Duration, try func() (T, error)) (T, error) {
	for {
		v, err := try()
		if err == nil || !unreachable(err) {
			return v, err
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
	}
}
