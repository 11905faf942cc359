package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat. It
// is 100 on every Linux architecture Go supports (the kernel fixes it for
// user space regardless of CONFIG_HZ).
const clockTicks = 100

// procCPU returns the user + system CPU time process pid has used so far,
// summed over all its threads (/proc/<pid>/stat utime and stime).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after it follow
	// the last ')'. utime and stime are fields 14 and 15.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// procRSS returns the resident set size of process pid in bytes
// (/proc/<pid>/status VmRSS).
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			break
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			break
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// machineTicks returns the columns of /proc/stat's aggregate "cpu" line,
// in ticks: user, nice, system, idle, iowait, irq, softirq, steal, ...
func machineTicks() ([]uint64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return nil, fmt.Errorf("parse /proc/stat: %q", line)
	}
	ticks := make([]uint64, len(f)-1)
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("parse /proc/stat: %q", line)
		}
		ticks[i] = v
	}
	return ticks, nil
}

// cpuTimes returns the machine's idle and total CPU time so far, in ticks
// (idle includes iowait).
func cpuTimes() (idle, total uint64, err error) {
	ticks, err := machineTicks()
	if err != nil {
		return 0, 0, err
	}
	for _, v := range ticks {
		total += v
	}
	return ticks[3] + ticks[4], total, nil
}

// machineBusy returns the CPU time all of the machine's cores have spent
// working so far: user, nice, system, irq and softirq (the kernel's
// loopback TCP work included, whichever process it ran for), not idle,
// iowait or steal (time the hypervisor gave another guest).
func machineBusy() (time.Duration, error) {
	ticks, err := machineTicks()
	if err != nil {
		return 0, err
	}
	busy := ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]
	return time.Duration(busy) * time.Second / clockTicks, nil
}

// kernelRelease is `uname -r`.
func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// cpuModel is the first "model name" of /proc/cpuinfo, or "".
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// isolate puts a child in its own process group (so a terminal's Ctrl-C
// reaches only the harness, which then stops its children in order) and
// has the kernel kill it if the harness dies first. (Pdeathsig fires when
// the forking OS thread exits; the Go runtime keeps its threads for the life
// of the process unless a goroutine exits while locked to one, which bench
// never does.)
func isolate(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// ownNetns makes cmd start in a network namespace of its own
// (CLONE_NEWNET), which holds only a loopback interface that is down: a
// socket the process makes there reaches nothing. It needs CAP_SYS_ADMIN.
func ownNetns(cmd *exec.Cmd) { cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWNET }

// netnsInode returns the inode of process pid's network namespace.
func netnsInode(pid int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// capSysAdmin is CAP_SYS_ADMIN's bit in /proc/<pid>/status CapEff.
const capSysAdmin = 21

// netnsUnavailable returns why this process cannot start children in
// network namespaces of their own and let them enter its own (CAP_SYS_ADMIN
// in its effective set, as root has), or nil.
func netnsUnavailable() error {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "CapEff:")
		if !ok {
			continue
		}
		caps, err := strconv.ParseUint(strings.TrimSpace(rest), 16, 64)
		if err != nil {
			return fmt.Errorf("parse /proc/self/status CapEff %q: %w", rest, err)
		}
		if caps&(1<<capSysAdmin) == 0 {
			return errors.New("needs root (CAP_SYS_ADMIN, to run proxies in network namespaces)")
		}
		return nil
	}
	return errors.New("no CapEff in /proc/self/status")
}

// bindNoPort is a net.Dialer Control function that sets
// IP_BIND_ADDRESS_NO_PORT: with a source address bound, the kernel then
// picks the port at connect time, knowing the destination, so ports in
// TIME_WAIT towards other destinations (or reusable ones, tcp_tw_reuse) do
// not run out or slow the port search. The harness opens hundreds of
// thousands of short connections from a few source IPs.
func bindNoPort(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

// lowestPriority gives every thread of this process the lowest scheduling
// priority (nice 19). Linux keeps nice values per thread and a new thread
// starts with its creator's, so once every thread has it, every thread the
// runtime starts later has it too. A thread that a thread not yet reniced
// starts while a pass runs is missed by that pass, so passes repeat until
// one lists no thread the earlier ones had not seen; and a thread whose
// creation began before its creator was reniced (so it starts at nice 0)
// can show in the listing only after that pass, so one more pass follows a
// millisecond later (TestXDSRoleStandsOffTheNode found such a thread about
// once in 20 runs without it). It returns the first failure.
func lowestPriority() error {
	if err := renicePasses(); err != nil {
		return err
	}
	time.Sleep(time.Millisecond)
	return renicePasses()
}

// renicePasses is lowestPriority's passes: until one sees no new thread.
func renicePasses() error {
	seen := map[int]bool{}
	for range 1000 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		fresh := false
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			fresh = fresh || !seen[tid]
			seen[tid] = true
			// A thread that exited since the listing is gone: not a failure.
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, 19); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("setpriority thread %d: %w", tid, err)
			}
		}
		if !fresh {
			return nil
		}
	}
	return errors.New("setpriority: threads kept starting faster than they were reniced")
}
