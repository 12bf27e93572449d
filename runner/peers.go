package runner

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/common"

	"github.com/sluice-gw/sluice/flowcontrol/replication"
)

// EPP replicas that share a pool's endpoints (issue 22): who the peers are, and which of them are alive.
//
// Each replica probes every peer's gRPC health service (the port of --grpc-health-port) every --peer-probe-interval;
// a peer that answers SERVING is heard, and one not heard for --peer-timeout is gone, as is one whose connection
// attempt fails with nothing heard from it for a probe interval (a replica killed or stopped: its port refuses). Admission
// recomputes on every pool snapshot which endpoints this replica owns among the live replicas (replication.View), so
// when a peer dies the survivors own its endpoints within two probe intervals (its connection refused) or
// --peer-timeout (it stopped answering) plus one snapshot interval, deciding alone: nothing waits on a peer, and no
// request crosses to one.

// peerHealthService is the health service a peer is probed on: it serves once the peer's pool has synced.
const peerHealthService = ReadinessService

// loadPeers reads the static peer list: --peers, or the --peers-file, parsed by replication.ParsePeers.
func (o *Options) loadPeers() ([]string, error) {
	if o.PeersFile == "" {
		peers, err := replication.ParsePeers(o.Peers)
		if err != nil {
			return nil, fmt.Errorf("--peers: %w", err)
		}
		return peers, nil
	}
	text, err := os.ReadFile(o.PeersFile)
	if err != nil {
		return nil, fmt.Errorf("--peers-file: %w", err)
	}
	peers, err := replication.ParsePeers(string(text))
	if err != nil {
		return nil, fmt.Errorf("--peers-file %s: %w", o.PeersFile, err)
	}
	return peers, nil
}

// Replicated reports whether this EPP runs as one of several replicas sharing the pool's endpoints.
func (o *Options) Replicated() bool {
	return o.Peers != "" || o.PeersFile != "" || o.PeersService != ""
}

// validatePeers checks the replication flags.
func (o *Options) validatePeers() error {
	if !o.Replicated() {
		return nil
	}
	var errs []error
	sources := 0
	for _, set := range []bool{o.Peers != "", o.PeersFile != "", o.PeersService != ""} {
		if set {
			sources++
		}
	}
	if sources > 1 {
		errs = append(errs, errors.New("set one of --peers, --peers-file and --peers-service"))
	}
	if o.PeersService != "" && o.StaticMode() {
		errs = append(errs, errors.New("--peers-service watches the EPP Service's EndpointSlices through the Kubernetes API and cannot be used in static mode; use --peers or --peers-file"))
	}
	if o.PeerProbeInterval <= 0 {
		errs = append(errs, fmt.Errorf("--peer-probe-interval must be positive, got %s", o.PeerProbeInterval))
	}
	if o.PeerExchangeInterval < 0 {
		errs = append(errs, fmt.Errorf("--peer-exchange-interval must not be negative, got %s", o.PeerExchangeInterval))
	}
	if o.PeerTimeout < 2*o.PeerProbeInterval {
		errs = append(errs, fmt.Errorf("--peer-timeout (%s) must be at least twice --peer-probe-interval (%s): a probe may take up to "+
			"an interval, so a live peer may go that long and one interval more between answers", o.PeerTimeout, o.PeerProbeInterval))
	}
	if o.Peers != "" || o.PeersFile != "" {
		peers, err := o.loadPeers()
		switch {
		case err != nil:
			errs = append(errs, err)
		case o.ReplicaID != "" && !slices.Contains(peers, o.ReplicaID):
			errs = append(errs, fmt.Errorf("--replica-id %q is not among the peers %v: every replica must find every other in the list", o.ReplicaID, peers))
		}
	}
	return errors.Join(errs...)
}

// newReplicationView builds this replica's view of its peers, or nil when it runs alone. Its own name is
// --replica-id, or else: with a static peer list, the one peer on --grpc-health-port whose host is an address of
// this machine; with --peers-service, this pod's address (its first non-loopback interface address) and the port.
func newReplicationView(ctx context.Context, opts *Options) (*replication.View, error) {
	if !opts.Replicated() {
		return nil, nil
	}
	var peers []string
	if opts.PeersService == "" {
		var err error
		if peers, err = opts.loadPeers(); err != nil {
			return nil, err
		}
	}
	self := opts.ReplicaID
	if self == "" {
		local, err := localAddresses()
		if err != nil {
			return nil, fmt.Errorf("finding this replica's name (set --replica-id): %w", err)
		}
		port := strconv.Itoa(opts.GRPCHealthPort)
		if opts.PeersService != "" {
			self, err = podPeerName(local, port)
		} else {
			self, err = staticPeerName(ctx, peers, local, port)
		}
		if err != nil {
			return nil, err
		}
	}
	return replication.NewView(self, peers, opts.PeerTimeout)
}

// staticPeerName returns the one peer on port whose host resolves to an address of this machine.
func staticPeerName(ctx context.Context, peers []string, local []net.IP, port string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var mine []string
	for _, p := range peers {
		host, pport, err := net.SplitHostPort(p)
		if err != nil || pport != port {
			continue
		}
		addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		if err != nil {
			continue
		}
		if slices.ContainsFunc(addrs, func(a net.IPAddr) bool {
			return slices.ContainsFunc(local, func(l net.IP) bool { return l.Equal(a.IP) })
		}) {
			mine = append(mine, p)
		}
	}
	if len(mine) != 1 {
		return "", fmt.Errorf("cannot tell which peer is this replica: %d of %v are on --grpc-health-port %s at an address of this machine (%v); set --replica-id",
			len(mine), peers, port, mine)
	}
	return mine[0], nil
}

// podPeerName returns this pod's first non-loopback address with port.
func podPeerName(local []net.IP, port string) (string, error) {
	for _, ip := range local {
		if !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
			return net.JoinHostPort(ip.String(), port), nil
		}
	}
	return "", fmt.Errorf("no non-loopback address on this machine (%v) to name this replica by; set --replica-id", local)
}

func localAddresses() ([]net.IP, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			out = append(out, n.IP)
		}
	}
	return out, nil
}

// peerProber probes every peer of view each interval and records those that answer.
type peerProber struct {
	view     *replication.View
	interval time.Duration
	clock    clock.WithTicker
	logger   logr.Logger

	conns map[string]*grpc.ClientConn // by peer; owned by Start's goroutine
	live  []string                    // the live set last logged
}

// Start implements manager.Runnable: it probes until ctx ends.
func (p *peerProber) Start(ctx context.Context) error {
	p.conns = map[string]*grpc.ClientConn{}
	defer func() {
		for _, c := range p.conns {
			_ = c.Close()
		}
	}()
	p.logger.Info("Sharing the pool's endpoints with peer replicas", "self", p.view.Self(), "peers", p.view.Peers(),
		"probeInterval", p.interval)
	ticker := p.clock.NewTicker(p.interval)
	defer ticker.Stop()
	for {
		p.probeAll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		}
	}
}

// probeAll probes every peer at once, each bounded by one interval, and logs a change of the live set.
func (p *peerProber) probeAll(ctx context.Context) {
	peers := p.view.Peers()
	for peer, c := range p.conns {
		if !slices.Contains(peers, peer) {
			_ = c.Close()
			delete(p.conns, peer)
		}
	}
	// A peer whose connection attempt fails is gone only if nothing was heard from it (probe or summary) for a whole
	// interval before this round: one slow handshake of a peer that still sends summaries does not drop it.
	silentSince := p.clock.Now().Add(-p.interval)
	var wg sync.WaitGroup
	for _, peer := range peers {
		conn, err := p.conn(peer)
		if err != nil {
			p.logger.Error(err, "Cannot probe peer", "peer", peer)
			continue
		}
		wg.Go(func() {
			probeCtx, cancel := context.WithTimeout(ctx, p.interval)
			defer cancel()
			resp, err := healthpb.NewHealthClient(conn).Check(probeCtx, &healthpb.HealthCheckRequest{Service: peerHealthService})
			switch {
			case err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING:
				p.view.Heard(peer, p.clock.Now())
			case status.Code(err) == codes.Unavailable && conn.GetState() == connectivity.TransientFailure:
				// A connection attempt failed, not a slow answer on a live connection: a replica killed or stopped,
				// or an address that no longer answers. Its endpoints are taken over now rather than after
				// --peer-timeout, unless it was heard within the last interval.
				p.view.Unreachable(peer, silentSince)
			}
		})
	}
	wg.Wait()
	if live := p.view.Live(p.clock.Now()); !slices.Equal(live, p.live) {
		p.logger.Info("Live replicas changed: endpoint ownership follows", "live", live, "self", p.view.Self())
		p.live = live
	}
}

// conn returns the connection to peer, made on first use. Reconnection backs off to one second at most, so a peer
// that restarts is heard within about a second of serving.
func (p *peerProber) conn(peer string) (*grpc.ClientConn, error) {
	if c, ok := p.conns[peer]; ok {
		return c, nil
	}
	c, err := grpc.NewClient(peer, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: p.interval, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: p.interval,
		}))
	if err != nil {
		return nil, err
	}
	p.conns[peer] = c
	return c, nil
}

// peersCache restricts the manager's cache of EndpointSlices to those of the EPP's own Service.
func peersCache(o *ctrl.Options, namespace, service string) {
	if o.Cache.ByObject == nil {
		o.Cache.ByObject = map[client.Object]cache.ByObject{}
	}
	o.Cache.ByObject[&discoveryv1.EndpointSlice{}] = cache.ByObject{
		Namespaces: map[string]cache.Config{namespace: {}},
		Label:      labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: service}),
	}
}

// peerSlices keeps view's peers at the ready addresses of the EPP Service's EndpointSlices, on port. It runs on
// every replica (not only an elected leader).
type peerSlices struct {
	reader    client.Reader
	view      *replication.View
	namespace string
	service   string
	port      string
	logger    logr.Logger
}

// setupPeerSlices watches the Service's EndpointSlices with mgr (its cache restricted by peersCache).
func setupPeerSlices(mgr manager.Manager, s *peerSlices) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("sluice-peers").
		For(&discoveryv1.EndpointSlice{}).
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false)}).
		Complete(s)
}

// Reconcile implements reconcile.Reconciler: whichever slice changed, the peers are read again from all of them.
func (s *peerSlices) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var list discoveryv1.EndpointSliceList
	if err := s.reader.List(ctx, &list, client.InNamespace(s.namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: s.service}); err != nil {
		return reconcile.Result{}, err
	}
	peers := slicePeers(list.Items, s.port, s.view.Self())
	if before := s.view.Peers(); !slices.Equal(before, slices.DeleteFunc(slices.Clone(peers), func(p string) bool { return p == s.view.Self() })) {
		s.logger.Info("Peer replicas changed", "service", s.service, "peers", peers, "self", s.view.Self())
	}
	s.view.SetPeers(peers)
	return reconcile.Result{}, nil
}

// slicePeers returns the ready endpoints' addresses of slices with port, sorted without duplicates. A terminating
// replica is not ready, so its endpoints move as soon as it starts to shut down; a missing condition means ready.
// Only slices of self's address family count: a dual-stack Service lists every pod once per family, and a replica
// that counted its own other address as a peer would leave that address's share of the endpoints to nobody.
func slicePeers(items []discoveryv1.EndpointSlice, port, self string) []string {
	family := addressFamily(self)
	var out []string
	for _, sl := range items {
		if family != "" && sl.AddressType != "" && sl.AddressType != family {
			continue
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				out = append(out, net.JoinHostPort(a, port))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// addressFamily returns the EndpointSlice address type of hostPort's host, or "" when it is no IP address.
func addressFamily(hostPort string) discoveryv1.AddressType {
	host, _, err := net.SplitHostPort(hostPort)
	if err != nil {
		host = hostPort
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return ""
	case ip.To4() != nil:
		return discoveryv1.AddressTypeIPv4
	default:
		return discoveryv1.AddressTypeIPv6
	}
}

// replicate runs the peer probes with the process and, with --peers-service, the watch of the Service's
// EndpointSlices.
func (r *Runner) replicate(p *process, opts *Options, pool common.GKNN, view *replication.View, peers PeerExchanger) error {
	logger := ctrl.Log.WithName("replication")
	if opts.PeersService != "" {
		if p.mgr == nil {
			return errors.New("--peers-service needs Kubernetes mode")
		}
		err := setupPeerSlices(p.mgr, &peerSlices{reader: p.mgr.GetClient(), view: view, namespace: pool.Namespace,
			service: opts.PeersService, port: strconv.Itoa(opts.GRPCHealthPort), logger: logger})
		if err != nil {
			return fmt.Errorf("watching the EndpointSlices of Service %s/%s: %w", pool.Namespace, opts.PeersService, err)
		}
	}
	if peers != nil {
		traffic, err := exchangeTraffic()
		if err != nil {
			return fmt.Errorf("registering the peer exchange's metrics: %w", err)
		}
		sender := &peerSender{view: view, admission: peers, interval: opts.PeerExchangeInterval, clock: r.clock, logger: logger,
			traffic: traffic}
		if err := p.add(everyReplica{sender}); err != nil {
			return err
		}
	}
	return p.add(everyReplica{&peerProber{view: view, interval: opts.PeerProbeInterval, clock: r.clock, logger: logger}})
}
