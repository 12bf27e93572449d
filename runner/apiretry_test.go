package runner

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
)

// refused is the error of a request to an API server that is not listening.
var refused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

// TestRetryUnreachable: a list or watch the API server refused is tried again until it is answered; its answers,
// errors included, reach the reflector at once.
func TestRetryUnreachable(t *testing.T) {
	tooMany := apierrors.NewTooManyRequests("slow down", 1)
	gone := apierrors.NewResourceExpired("too old resource version")
	for _, tc := range []struct {
		name     string
		errs     []error // the first calls' errors; the calls after succeed
		cancel   bool    // ctx ends while the API server still refuses
		wantErr  error
		wantCall int
	}{
		{name: "answered at once", wantCall: 1},
		{name: "refused, then answered", errs: []error{refused, refused, refused}, wantCall: 4},
		{name: "connection reset, then answered", errs: []error{os.NewSyscallError("read", syscall.ECONNRESET)}, wantCall: 2},
		{name: "throttled: the reflector backs off", errs: []error{tooMany}, wantErr: tooMany, wantCall: 1},
		{name: "refused, then expired: the reflector relists", errs: []error{refused, gone}, wantErr: gone, wantCall: 2},
		{name: "refused until the informer stops", errs: []error{refused, refused, refused, refused, refused}, cancel: true, wantErr: refused, wantCall: 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, method := range []string{"list", "watch"} {
				ctx, cancel := context.WithCancel(t.Context())
				calls := 0
				answer := func() error {
					calls++
					if calls <= len(tc.errs) {
						if tc.cancel && calls == len(tc.errs) {
							cancel()
						}
						return tc.errs[calls-1]
					}
					return nil
				}
				r := &retryUnreachable{first: time.Millisecond, lw: &toolscache.ListWatch{
					ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
						return &corev1.PodList{}, answer()
					},
					WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
						return watch.NewEmptyWatch(), answer()
					},
				}}
				var err error
				if method == "list" {
					_, err = r.ListWithContext(ctx, metav1.ListOptions{})
				} else {
					_, err = r.WatchWithContext(ctx, metav1.ListOptions{})
				}
				cancel()
				if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
					t.Errorf("%s: error %v, want %v", method, err, tc.wantErr)
				}
				if calls != tc.wantCall {
					t.Errorf("%s: %d calls, want %d", method, calls, tc.wantCall)
				}
			}
		})
	}
}

// TestPromptInformers: the manager's informers list and watch through retryUnreachable, and an informer a
// ManagerSetup chose is kept.
func TestPromptInformers(t *testing.T) {
	var o ctrl.Options
	promptInformers(&o)
	if o.Cache.NewInformer == nil {
		t.Fatal("no informer constructor set")
	}
	own := func(toolscache.ListerWatcher, runtime.Object, time.Duration, toolscache.Indexers) toolscache.SharedIndexInformer {
		return nil
	}
	o.Cache.NewInformer = own
	promptInformers(&o)
	if o.Cache.NewInformer(nil, nil, 0, nil) != nil {
		t.Error("promptInformers replaced an informer constructor already set")
	}
}
