package runner

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
)

// grpcServer runs a gRPC server on a port until its context ends, then stops
// it gracefully, forcing the stop after gracePeriod.
type grpcServer struct {
	name        string
	server      *grpc.Server
	port        int
	gracePeriod time.Duration
	// stopping, if set, is closed as the graceful stop begins: handlers of streams that never end by themselves (the
	// peer exchange) return on it.
	stopping chan struct{}
	logger   logr.Logger
	// listening, when set, is called with the bound address once listening;
	// tests use it with port 0.
	listening func(net.Addr)
}

// Start implements manager.Runnable.
func (g *grpcServer) Start(ctx context.Context) error {
	lis, err := net.Listen("tcp", fmt.Sprintf(":%d", g.port))
	if err != nil {
		return fmt.Errorf("%s gRPC server: listening on port %d: %w", g.name, g.port, err)
	}
	if g.listening != nil {
		g.listening(lis.Addr())
	}
	g.logger.Info("gRPC server listening", "name", g.name, "address", lis.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- g.server.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("%s gRPC server: %w", g.name, err)
	case <-ctx.Done():
	}
	if g.stopping != nil {
		close(g.stopping)
	}
	stopped := make(chan struct{})
	go func() {
		g.server.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(g.gracePeriod):
		g.server.Stop()
		<-stopped
	}
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every replica
// serves, as upstream's do; readiness tells the proxy which one to use.
func (g *grpcServer) NeedLeaderElection() bool { return false }
