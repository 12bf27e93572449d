package procs

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// StopGrace is how long a process may take to exit after SIGTERM before
// Stop kills it.
const StopGrace = 5 * time.Second

// Process is a child process whose output goes to a log file.
type Process struct {
	// Name names the process in errors.
	Name    string
	logPath string
	bin     string
	args    []string
	cmd     *exec.Cmd
	// done is closed when the process has exited; err is then its exit
	// status.
	done chan struct{}
	err  error
}

// Start starts bin with args, its stdout and stderr appended to logPath.
// The process gets SIGTERM if this one dies first (Linux; see
// setParentDeathSignal).
func Start(name, logPath, bin string, args ...string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logFile, "# %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	setParentDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, logPath: logPath, bin: bin, args: args, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Restart starts the same command again, appending to the same log, once
// this process has exited (it stops it first if it has not).
func (p *Process) Restart() (*Process, error) {
	p.Stop()
	return Start(p.Name, p.logPath, p.bin, p.args...)
}

// Pid is the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// CPU returns the CPU time (user + system) the running process has used.
func (p *Process) CPU() (time.Duration, error) { return cpuTime(p.cmd.Process.Pid) }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitError describes an exit that was not asked for, with the end of the
// log.
func (p *Process) ExitError() error {
	return fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.Name, p.err, p.logPath, LogTail(p.logPath, 15))
}

// Stop sends SIGTERM, waits up to StopGrace, then kills. It returns once
// the process has exited; calling it again is harmless.
func (p *Process) Stop() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(StopGrace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Kill sends SIGKILL, as a crashing machine or an OOM kill would end the
// process, and returns once it has exited.
func (p *Process) Kill() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// LogTail returns the last n lines of a file.
func LogTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// WaitReady polls check every 100 ms until it succeeds, a watched process
// exits, timeout passes or ctx ends.
func WaitReady(ctx context.Context, timeout time.Duration, what string, watched []*Process, check func(context.Context) error) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, p := range watched {
			if p.Exited() {
				return fmt.Errorf("waiting for %s: %w", what, p.ExitError())
			}
		}
		last := check(ctx)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("%s not ready after %v: %w", what, timeout, last)
		case <-tick.C:
		}
	}
}

// HTTPOK is a readiness check: GET url answers 200.
func HTTPOK(client *http.Client, url string) func(context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

// TCPAccepts is a readiness check: something accepts TCP on addr.
func TCPAccepts(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
}
