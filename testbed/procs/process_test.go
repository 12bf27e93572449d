package procs

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func shell(t *testing.T) string {
	t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh on this machine")
	}
	return sh
}

func TestProcessStop(t *testing.T) {
	log := filepath.Join(t.TempDir(), "p.log")
	p, err := Start("sleeper", log, shell(t), "-c", "echo started; exec sleep 600")
	if err != nil {
		t.Fatal(err)
	}
	if p.Exited() {
		t.Fatal("exited at once")
	}
	p.Stop()
	if !p.Exited() {
		t.Fatal("still running after stop")
	}
	p.Stop() // harmless the second time
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), "# ") || !strings.Contains(string(b), "exec sleep 600") {
		t.Errorf("log %q: want the command line first", b)
	}
}

func TestWaitReadyProcessExits(t *testing.T) {
	log := filepath.Join(t.TempDir(), "p.log")
	p, err := Start("crasher", log, shell(t), "-c", "echo 'bad flag --nope'; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	never := func(context.Context) error { return errors.New("not yet") }
	err = WaitReady(t.Context(), time.Minute, "the crasher", []*Process{p}, never)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"waiting for the crasher", "crasher exited (exit status 3)", "bad flag --nope"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestWaitReadyChecks(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		http.Error(w, "nope", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	if err := WaitReady(t.Context(), time.Minute, "server", nil, HTTPOK(srv.Client(), srv.URL+"/health")); err != nil {
		t.Errorf("healthy server: %v", err)
	}
	if err := HTTPOK(srv.Client(), srv.URL+"/other")(t.Context()); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("unhealthy answer: %v", err)
	}
	addr := strings.TrimPrefix(srv.URL, "http://")
	if err := TCPAccepts(addr)(t.Context()); err != nil {
		t.Errorf("listening address: %v", err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	never := func(context.Context) error { return errors.New("not yet") }
	if err := WaitReady(ctx, time.Minute, "x", nil, never); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

func TestFreePortRange(t *testing.T) {
	base, err := FreePortRange(5, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if base < portRangeLow || base+5 > portRangeHigh {
		t.Errorf("base %d outside [%d, %d)", base, portRangeLow, portRangeHigh)
	}
	// A taken port makes a block unusable.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	taken := l.Addr().(*net.TCPAddr).Port
	if portsFree(taken, 1, []string{"127.0.0.1"}) {
		t.Errorf("port %d is listened on but reported free", taken)
	}
}

func TestProcessKillAndRestart(t *testing.T) {
	log := filepath.Join(t.TempDir(), "p.log")
	p, err := Start("sleeper", log, shell(t), "-c", "echo up; exec sleep 600")
	if err != nil {
		t.Fatal(err)
	}
	p.Kill()
	if !p.Exited() || !strings.Contains(p.ExitError().Error(), "signal: killed") {
		t.Fatalf("after Kill: exited %v, %v", p.Exited(), p.ExitError())
	}
	q, err := p.Restart()
	if err != nil {
		t.Fatal(err)
	}
	defer q.Stop()
	if q.Exited() || q.Pid() == p.Pid() {
		t.Fatalf("restart: exited %v, pid %d (was %d)", q.Exited(), q.Pid(), p.Pid())
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "# "); n != 2 {
		t.Errorf("log %q: want both command lines, got %d", b, n)
	}
}
