package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const cgroupRoot = "/sys/fs/cgroup"

// controllers returns the directories of the mounted cgroup v1 hierarchies
// (cpu, memory, pids, ..., and the named systemd one).
func controllers() []string {
	ents, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return nil
	}
	var dirs []string
	for _, e := range ents {
		d := filepath.Join(cgroupRoot, e.Name())
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() || e.Name() == "unified" {
			continue // symlinks such as cpu,cpuacct; the v2 hierarchy
		}
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// joinCgroups moves pid into CgroupName/host in every hierarchy, so that
// Down can find every process a component leaves behind (containerd's
// shims, for one).
func joinCgroups(pid int) error {
	for _, d := range controllers() {
		g := filepath.Join(d, CgroupName, "host")
		if err := os.MkdirAll(g, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", g, err)
		}
		if strings.HasSuffix(d, "/cpuset") {
			// A new cpuset cgroup starts with no cpus or mems.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				for _, dir := range []string{filepath.Join(d, CgroupName), g} {
					if b, _ := os.ReadFile(filepath.Join(dir, f)); strings.TrimSpace(string(b)) == "" {
						parent, _ := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
						os.WriteFile(filepath.Join(dir, f), parent, 0o644)
					}
				}
			}
		}
		if err := os.WriteFile(filepath.Join(g, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("join %s: %w", g, err)
		}
	}
	return nil
}

// killCgroups kills every process in the cluster's cgroups (the host
// components, their children, every pod) and removes the cgroups.
func killCgroups() error {
	for round := 0; round < 50; round++ {
		pids := cgroupPids()
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if pids := cgroupPids(); len(pids) > 0 {
		return fmt.Errorf("processes %v still in cgroup %s", pids, CgroupName)
	}
	var errs []error
	for _, d := range controllers() {
		var dirs []string
		filepath.WalkDir(filepath.Join(d, CgroupName), func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		slices.Reverse(dirs) // children first
		for _, g := range dirs {
			if err := os.Remove(g); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// cgroupPids lists the processes in the cluster's cgroups, read from the
// pids hierarchy (or any hierarchy, if pids is not mounted).
func cgroupPids() []int {
	seen := map[int]bool{}
	for _, d := range controllers() {
		filepath.WalkDir(filepath.Join(d, CgroupName), func(p string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() || e.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if n, err := strconv.Atoi(f); err == nil {
					seen[n] = true
				}
			}
			return nil
		})
	}
	pids := make([]int, 0, len(seen))
	for p := range seen {
		pids = append(pids, p)
	}
	slices.Sort(pids)
	return pids
}
