package procs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// setParentDeathSignal asks the kernel to send the child SIGTERM when the
// thread that started it exits, so a killed suite leaves no fleet behind.
// Go keeps that thread alive for the life of the process unless it is
// locked and its goroutine exits, which the suite never does.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}

// clockTick is the unit of /proc/<pid>/stat's CPU times: USER_HZ, 100 on
// every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// cpuTime returns the CPU time (user + system) process pid has used, from
// /proc/<pid>/stat.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(b)
}

// parseStatCPU returns utime + stime from the contents of a /proc/<pid>/stat
// file.
func parseStatCPU(b []byte) (time.Duration, error) {
	// The command name (field 2) is in parentheses and may hold spaces and
	// parentheses itself; the fields after the last ")" start at field 3
	// (state), so utime and stime (fields 14 and 15) are the 12th and 13th.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("proc stat: no command name")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields after the command name, want at least 13", len(f))
	}
	var ticks int64
	for _, field := range f[11:13] {
		n, err := strconv.ParseInt(string(field), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("proc stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}
