package runner

import (
	"context"
	"sync/atomic"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	logutil "sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/logging"
)

// Health services, named as upstream's EPP names them so existing probes work.
const (
	LivenessService  = "liveness"
	ReadinessService = "readiness"
)

// poolSyncer reports whether the endpoint pool is known.
type poolSyncer interface {
	PoolHasSynced() bool
}

// healthServer answers gRPC health checks with upstream's semantics: without
// leader election every service is serving once the pool has synced; with it,
// liveness always passes and readiness (and the ext_proc service, and the
// empty service name load balancers use) passes only on the synced leader.
type healthServer struct {
	healthpb.UnimplementedHealthServer
	logger                logr.Logger
	pool                  poolSyncer
	isLeader              *atomic.Bool
	leaderElectionEnabled bool
}

func (s *healthServer) Check(_ context.Context, in *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	synced := s.pool.PoolHasSynced()
	serving := synced
	if s.leaderElectionEnabled {
		switch in.Service {
		case LivenessService:
			serving = true
		case ReadinessService, "", extprocv3.ExternalProcessor_ServiceDesc.ServiceName:
			serving = synced && s.isLeader.Load()
		default:
			return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVICE_UNKNOWN}, nil
		}
	}
	if !serving {
		s.logger.V(logutil.DEFAULT).Info("gRPC health check not serving", "service", in.Service, "synced", synced, "leader", s.isLeader.Load())
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (s *healthServer) List(ctx context.Context, _ *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	services := []string{extprocv3.ExternalProcessor_ServiceDesc.ServiceName}
	if s.leaderElectionEnabled {
		services = append(services, LivenessService, ReadinessService)
	}
	statuses := make(map[string]*healthpb.HealthCheckResponse, len(services))
	for _, svc := range services {
		resp, err := s.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			return nil, err
		}
		statuses[svc] = resp
	}
	return &healthpb.HealthListResponse{Statuses: statuses}, nil
}

func (s *healthServer) Watch(*healthpb.HealthCheckRequest, healthpb.Health_WatchServer) error {
	return status.Error(codes.Unimplemented, "Watch is not implemented")
}
