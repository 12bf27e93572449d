package runner_test

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"

	"github.com/sluice-gw/sluice/runner"
	"github.com/sluice-gw/sluice/runner/runnertest"
)

// runnableAdmission is an admission controller that is also a manager.Runnable, as Sluice admission is. Once its
// context ends it holds its Start until the test lets it finish, like admission answering what still waits.
type runnableAdmission struct {
	started, stopping, finish chan struct{}
	finished                  atomic.Bool
}

func (a *runnableAdmission) Admit(context.Context, *handlers.RequestContext, int) error { return nil }

func (a *runnableAdmission) Start(ctx context.Context) error {
	close(a.started)
	<-ctx.Done()
	close(a.stopping)
	<-a.finish
	a.finished.Store(true)
	return nil
}

// TestShutdownJoinsAdmission runs the EPP in process: an admission controller that is a runnable is started with the
// servers, and Run returns only after it has finished, however long that takes after the EPP is told to stop.
func TestShutdownJoinsAdmission(t *testing.T) {
	adm := &runnableAdmission{started: make(chan struct{}), stopping: make(chan struct{}), finish: make(chan struct{})}
	r := runner.New().
		WithOutput(io.Discard).
		WithAdmission(func(context.Context, runner.AdmissionDeps) (requestcontrol.AdmissionController, error) {
			return adm, nil
		})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	returned := make(chan error, 1)
	go func() {
		returned <- r.Run(ctx, []string{
			"--static-endpoints=127.0.0.1:9", // nothing listens: the pool has no metrics, which this test does not need
			fmt.Sprintf("--grpc-port=%d", runnertest.FreePort(t)),
			fmt.Sprintf("--grpc-health-port=%d", runnertest.FreePort(t)),
			fmt.Sprintf("--metrics-port=%d", runnertest.FreePort(t)),
			"--secure-serving=false",
			"--tracing=false",
		})
	}()
	select {
	case <-adm.started:
	case err := <-returned:
		t.Fatalf("Run returned before starting the admission controller: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the admission controller was not started with the servers")
	}
	cancel()
	select {
	case <-adm.stopping:
	case err := <-returned:
		t.Fatalf("Run returned before the admission controller saw the stop: %v", err)
	}
	close(adm.finish)
	if err := <-returned; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !adm.finished.Load() {
		t.Fatal("Run returned before the admission controller finished")
	}
}
