package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
)

// Endpoint is one static model-server endpoint.
type Endpoint struct {
	Addr netip.Addr
	Port int
}

func (e Endpoint) String() string {
	return net.JoinHostPort(e.Addr.String(), strconv.Itoa(e.Port))
}

// ParseEndpoints parses host:port items. Hosts must be IP addresses: the proxy
// routes to the address the EPP names (Envoy's original-destination cluster),
// so a name would have to be resolved by someone, and silently by no one is
// worse than an error. Duplicates are rejected.
func ParseEndpoints(items []string) ([]Endpoint, error) {
	var (
		eps  []Endpoint
		errs []error
		seen = map[Endpoint]bool{}
	)
	for _, item := range items {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		host, portText, err := net.SplitHostPort(item)
		if err != nil {
			errs = append(errs, fmt.Errorf("endpoint %q: want host:port (IPv6 as [addr]:port): %w", item, err))
			continue
		}
		addr, err := netip.ParseAddr(host)
		if err != nil || addr.Zone() != "" {
			errs = append(errs, fmt.Errorf("endpoint %q: host %q must be an IP address without zone", item, host))
			continue
		}
		port, err := strconv.Atoi(portText)
		if err != nil || port < 1 || port > 65535 {
			errs = append(errs, fmt.Errorf("endpoint %q: port %q must be a number from 1 to 65535", item, portText))
			continue
		}
		ep := Endpoint{Addr: addr.Unmap(), Port: port}
		if seen[ep] {
			errs = append(errs, fmt.Errorf("endpoint %q is listed twice", item))
			continue
		}
		seen[ep] = true
		eps = append(eps, ep)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if len(eps) == 0 {
		return nil, errors.New("no endpoints given")
	}
	return eps, nil
}

// ParseEndpointsFile parses the contents of a static endpoints file: items
// separated by newlines or commas, with '#' starting a comment to the end of
// the line.
func ParseEndpointsFile(content []byte) ([]Endpoint, error) {
	var items []string
	for _, line := range strings.Split(string(content), "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		for _, item := range strings.Split(line, ",") {
			if item = strings.TrimSpace(item); item != "" {
				items = append(items, item)
			}
		}
	}
	return ParseEndpoints(items)
}

// staticLabel marks the synthetic pods of static mode; the synthetic pool
// selects on it.
const staticLabel = "sluice.dev/static-endpoint"

// activePortsAnnotation is upstream's pod annotation that restricts which of
// the pool's target ports a pod serves (datastore.activePortsAnnotation).
const activePortsAnnotation = "inference.networking.k8s.io/active-ports"

// staticPool turns static endpoints into what the upstream datastore already
// understands: an EndpointPool whose target ports are every endpoint's port,
// and one Ready pod per endpoint whose active-ports annotation names its own
// port. Upstream's reconciliation code then adds and removes endpoints.
type staticPool struct {
	namespace string

	mu   sync.Mutex
	pods []corev1.Pod
}

// set replaces the endpoint set and returns the matching pool.
func (s *staticPool) set(eps []Endpoint) *datalayer.EndpointPool {
	pods := make([]corev1.Pod, 0, len(eps))
	var ports []int
	for _, ep := range eps {
		pods = append(pods, staticPod(s.namespace, ep))
		if !slices.Contains(ports, ep.Port) {
			ports = append(ports, ep.Port)
		}
	}
	slices.Sort(ports)
	s.mu.Lock()
	s.pods = pods
	s.mu.Unlock()

	pool := datalayer.NewEndpointPool(s.namespace, staticPoolName)
	pool.Selector = map[string]string{staticLabel: "true"}
	pool.TargetPorts = ports
	return pool
}

// podNames returns the names of the current synthetic pods.
func (s *staticPool) podNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, len(s.pods))
	for i := range s.pods {
		names[i] = s.pods[i].Name
	}
	return names
}

func staticPod(namespace string, ep Endpoint) corev1.Pod {
	name := "static-" + strings.NewReplacer(".", "-", ":", "-").Replace(ep.Addr.String()) + "-" + strconv.Itoa(ep.Port)
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   namespace,
			Labels:      map[string]string{staticLabel: "true"},
			Annotations: map[string]string{activePortsAnnotation: strconv.Itoa(ep.Port)},
		},
		Status: corev1.PodStatus{
			PodIP:      ep.Addr.String(),
			Phase:      corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
}

// Get implements client.Reader for the datastore's resync; only pods exist.
func (s *staticPool) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return fmt.Errorf("static mode serves only pods, not %T", obj)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.pods {
		if s.pods[i].Name == key.Name && s.pods[i].Namespace == key.Namespace {
			s.pods[i].DeepCopyInto(pod)
			return nil
		}
	}
	return apierrors.NewNotFound(corev1.Resource("pods"), key.Name)
}

// List implements client.Reader for the datastore's resync; only pods exist.
func (s *staticPool) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	pods, ok := list.(*corev1.PodList)
	if !ok {
		return fmt.Errorf("static mode serves only pods, not %T", list)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pods.Items = make([]corev1.Pod, len(s.pods))
	for i := range s.pods {
		s.pods[i].DeepCopyInto(&pods.Items[i])
	}
	return nil
}

var _ client.Reader = (*staticPool)(nil)

// poolStore is the part of the upstream datastore static mode drives.
type poolStore interface {
	PoolSet(ctx context.Context, reader client.Reader, pool *datalayer.EndpointPool) error
	PodUpdateOrAddIfNotExist(ctx context.Context, pod *corev1.Pod) bool
	PodDelete(podName string)
}

// apply makes store serve exactly eps.
func (s *staticPool) apply(ctx context.Context, store poolStore, eps []Endpoint) error {
	before := s.podNames()
	pool := s.set(eps)
	if err := store.PoolSet(ctx, s, pool); err != nil {
		return err
	}
	s.mu.Lock()
	current := make([]corev1.Pod, len(s.pods))
	copy(current, s.pods)
	s.mu.Unlock()
	keep := map[string]bool{}
	for i := range current {
		keep[current[i].Name] = true
		store.PodUpdateOrAddIfNotExist(ctx, &current[i])
	}
	for _, name := range before {
		if !keep[name] {
			store.PodDelete(name)
		}
	}
	return nil
}

// fileWatcher re-reads a static endpoints file and applies changes. A file
// that fails to parse is logged and ignored: the last good set keeps serving.
type fileWatcher struct {
	path     string
	interval time.Duration
	clock    clock.WithTicker
	pool     *staticPool
	store    poolStore
	logger   logr.Logger
	last     []byte
}

// load reads and applies the file once; it is also the initial load.
func (w *fileWatcher) load(ctx context.Context) error {
	content, err := os.ReadFile(w.path)
	if err != nil {
		return fmt.Errorf("static endpoints file: %w", err)
	}
	if w.last != nil && bytes.Equal(content, w.last) {
		return nil
	}
	eps, err := ParseEndpointsFile(content)
	if err != nil {
		return fmt.Errorf("static endpoints file %s: %w", w.path, err)
	}
	if err := w.pool.apply(ctx, w.store, eps); err != nil {
		return err
	}
	w.last = content
	w.logger.Info("Static endpoints loaded", "file", w.path, "endpoints", len(eps))
	return nil
}

// Start implements manager.Runnable.
func (w *fileWatcher) Start(ctx context.Context) error {
	t := w.clock.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			if err := w.load(ctx); err != nil {
				w.logger.Error(err, "Keeping the previous static endpoints")
			}
		}
	}
}

// startStatic loads the static endpoints into the datastore and returns the
// runnable that keeps a static endpoints file in force (a no-op runnable for
// --static-endpoints, which cannot change).
func (r *Runner) startStatic(ctx context.Context, opts *Options, ds datastore.Datastore, namespace string) (manager.Runnable, error) {
	pool := &staticPool{namespace: namespace}
	logger := ctrl.Log.WithName("static-endpoints")
	if opts.ObjectivesFile != "" {
		n, err := loadObjectivesFile(opts.ObjectivesFile, namespace, ds)
		if err != nil {
			return nil, err
		}
		logger.Info("Inference objectives loaded", "file", opts.ObjectivesFile, "objectives", n)
	}
	if opts.StaticEndpointsFile == "" {
		eps, err := ParseEndpoints(opts.StaticEndpoints)
		if err != nil {
			return nil, fmt.Errorf("--static-endpoints: %w", err)
		}
		if err := pool.apply(ctx, ds, eps); err != nil {
			return nil, err
		}
		logger.Info("Static endpoints loaded", "endpoints", len(eps))
		return manager.RunnableFunc(func(ctx context.Context) error { <-ctx.Done(); return nil }), nil
	}
	w := &fileWatcher{
		path:     opts.StaticEndpointsFile,
		interval: opts.StaticEndpointsReloadInterval,
		clock:    r.clock,
		pool:     pool,
		store:    ds,
		logger:   logger,
	}
	if err := w.load(ctx); err != nil {
		return nil, err
	}
	return w, nil
}
