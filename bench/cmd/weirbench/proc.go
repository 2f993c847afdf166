package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"weir/internal/netns"
)

// daemon is a long-running process started inside a namespace (weir, the
// peer, iperf3 -s, the connection-rate server). It is killed with its
// process group by stop, and by the kernel (Pdeathsig) if the harness dies.
type daemon struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once the process has exited
	waitErr error         // valid once done is closed
	once    sync.Once
}

// startDaemon starts argv inside ns with its output in dir/<name>.log. The
// child inherits the namespace of the OS thread that forks it; that thread
// (inside ns.Do) lives until the child exits, so Pdeathsig fires only when
// the harness itself goes.
func startDaemon(ns *netns.NS, dir, name string, env []string, argv ...string) (*daemon, error) {
	d := &daemon{name: name, logPath: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	logf, err := os.Create(d.logPath)
	if err != nil {
		return nil, err
	}
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.Env = append(os.Environ(), env...)
	// A process group of its own: stop kills what a shell command started too.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	started := make(chan error, 1)
	go ns.Do(func() error {
		defer close(d.done)
		defer logf.Close()
		if err := d.cmd.Start(); err != nil {
			started <- err
			return nil
		}
		started <- nil
		d.waitErr = d.cmd.Wait()
		return nil
	})
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return d, nil
}

// pid is the process's id (its process group's too).
func (d *daemon) pid() int { return d.cmd.Process.Pid }

// exited reports whether the process has ended.
func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, waits up to grace, then kills
// the group. It is safe to call more than once.
func (d *daemon) stop(grace time.Duration) {
	d.once.Do(func() {
		pg := -d.pid()
		syscall.Kill(pg, syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(grace):
		}
		syscall.Kill(pg, syscall.SIGKILL) // also what the group leader left behind
		<-d.done
	})
}

// tail is the last n bytes of the process's output.
func (d *daemon) tail(n int) string {
	b, _ := os.ReadFile(d.logPath)
	return string(b[max(0, len(b)-n):])
}

// runIn runs argv inside ns to completion (bounded by ctx) and returns its
// stdout; a failure carries the end of stderr.
func runIn(ctx context.Context, ns *netns.NS, argv ...string) ([]byte, error) {
	var out, errb bytes.Buffer
	err := ns.Do(func() error {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		cmd.WaitDelay = 2 * time.Second
		return cmd.Run()
	})
	if err != nil {
		s := errb.String()
		if len(s) > 2000 {
			s = s[len(s)-2000:]
		}
		return out.Bytes(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(s))
	}
	return out.Bytes(), nil
}

// usage is what a process group used: CPU seconds (user + system, of the
// live members) and resident memory high-water marks (VmHWM) summed over
// them.
type usage struct {
	CPUSec  float64
	PeakRSS int64 // bytes
	RSS     int64 // bytes, now (VmRSS)
}

// clkTck is USER_HZ, the unit of utime and stime in /proc/PID/stat: 100 on
// every Linux architecture Go supports.
const clkTck = 100

// groupPIDs are the processes of process group pgid.
func groupPIDs(pgid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err == nil && st.pgrp == pgid {
			out = append(out, pid)
		}
	}
	return out
}

type procStat struct {
	pgrp         int
	utime, stime uint64 // clock ticks
}

// readStat parses /proc/PID/stat. The command name (field 2) may hold
// spaces and parentheses: the fields after it start after the last ')'.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(string(b))
}

func parseStat(s string) (procStat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, errors.New("stat: no command field")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): pgrp is field 5, utime 14, stime 15.
	if len(f) < 13 {
		return procStat{}, errors.New("stat: too few fields")
	}
	var st procStat
	var err1, err2, err3 error
	st.pgrp, err1 = strconv.Atoi(f[2])
	st.utime, err2 = strconv.ParseUint(f[11], 10, 64)
	st.stime, err3 = strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return procStat{}, fmt.Errorf("stat: %w", err)
	}
	return st, nil
}

// vmHWM is the process's peak resident set in bytes, from /proc/PID/status.
func vmHWM(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseHWM(string(b))
}

func parseHWM(status string) (int64, error) {
	for _, line := range strings.Split(status, "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("status: VmHWM %q", rest)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("status: no VmHWM")
}

// groupUsage measures the process group pgid now.
func groupUsage(pgid int) (usage, error) {
	pids := groupPIDs(pgid)
	if len(pids) == 0 {
		return usage{}, fmt.Errorf("process group %d is gone", pgid)
	}
	var u usage
	for _, pid := range pids {
		st, err := readStat(pid)
		if err != nil {
			continue // exited meanwhile
		}
		u.CPUSec += float64(st.utime+st.stime) / clkTck
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
			if hwm, err := parseHWM(string(b)); err == nil {
				u.PeakRSS += hwm
			}
			if rss, err := statusKB(string(b), "VmRSS:"); err == nil {
				u.RSS += rss
			}
		}
	}
	return u, nil
}

// resetPeak resets the group's VmHWM to the current RSS (clear_refs 5), so
// the next groupUsage shows the peak of the run in between.
func resetPeak(pgid int) {
	for _, pid := range groupPIDs(pgid) {
		os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
	}
}
