package runner

import (
	"context"
	"math"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
	ctrl "sigs.k8s.io/controller-runtime"
)

// apiRetryFirst and apiRetryMost bound the wait between the manager's informers' tries of an API server they cannot
// reach: it starts short, so the informers resume soon after a restart, and doubles, with jitter, so that many
// replicas do not knock in step on an API server that stays away.
const (
	apiRetryFirst = 200 * time.Millisecond
	apiRetryMost  = 2 * time.Second
)

// promptInformers makes the manager's informers resume within apiRetryMost of the API server's return.
//
// Left to itself, client-go's reflector answers a list or watch the API server refused with an exponential back-off
// that grows to half a minute and resets only after minutes, so after an outage of a few seconds its next attempt can
// come long after the API server is back, and all that time the EPP's cache, and so its pods, miss every change: a
// pod deleted then keeps its traffic. A connection an API server refuses or drops costs it little, so the informers
// retry those on a short, capped back-off instead; other errors (429, a watch that expired) still reach the
// reflector and its own back-off. The bench doc's chaos section has the measurements.
func promptInformers(o *ctrl.Options) {
	if o.Cache.NewInformer != nil {
		return
	}
	o.Cache.NewInformer = func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
		return toolscache.NewSharedIndexInformer(&retryUnreachable{lw: toolscache.ToListerWatcherWithContext(lw), semantics: lw},
			obj, resync, indexers)
	}
}

// retryUnreachable is a ListerWatcher that repeats a list or watch while the API server cannot be reached, until it
// is reached or ctx ends.
type retryUnreachable struct {
	lw        toolscache.ListerWatcherWithContext
	semantics any           // the ListerWatcher given, which may declare its WatchList semantics
	first     time.Duration // the first wait; apiRetryFirst when zero
}

// unreachable tells the errors of an API server that is down, restarting or cut off (refused or dropped
// connections) from its answers.
func unreachable(err error) bool {
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err)
}

func (r *retryUnreachable) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return retry(ctx, r.first, func() (runtime.Object, error) { return r.lw.ListWithContext(ctx, opts) })
}

func (r *retryUnreachable) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return retry(ctx, r.first, func() (watch.Interface, error) { return r.lw.WatchWithContext(ctx, opts) })
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

// retry calls try until it returns something other than an unreachable API server's error, waiting first (or
// apiRetryFirst), then twice as long each time up to apiRetryMost, with jitter; when ctx ends it returns try's last
// answer.
func retry[T any](ctx context.Context, first time.Duration, try func() (T, error)) (T, error) {
	if first <= 0 {
		first = apiRetryFirst
	}
	backoff := wait.Backoff{Duration: first, Factor: 2, Jitter: 0.2, Steps: math.MaxInt32, Cap: apiRetryMost}
	for {
		v, err := try()
		if err == nil || !unreachable(err) {
			return v, err
		}
		t := time.NewTimer(backoff.Step())
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
	}
}
