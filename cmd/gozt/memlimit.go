package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// The memory limit admission control measures against (admission.Controller):
// the lower of the Go runtime's (GOMEMLIMIT) and the cgroup's.
//
// When the operator set no GOMEMLIMIT and the process's cgroup has a memory
// limit, gozt sets the runtime's to defaultMemLimitPercent of it, the
// default Go operators know from automemlimit-style libraries: the
// collector then works harder as the heap nears the cgroup limit instead of
// letting garbage push the process into the OOM killer. ztunnel, in Rust,
// has no collector and no such setting. A GOMEMLIMIT the operator set
// (even "off") is left alone.
const defaultMemLimitPercent = 90

// cgroupFS is where cgroup hierarchies are mounted.
const cgroupFS = "/sys/fs/cgroup"

// noLimit is the smallest value taken as no limit: cgroup v1 writes
// unlimited as a page-rounded MaxInt64.
const noLimit = 1 << 62

// cgroupMemory is the memory controller's directory of a cgroup.
type cgroupMemory struct {
	dir  string // the cgroup's directory
	top  string // the hierarchy's mount point: dir and its parents up to top limit it
	file string // memory.max (v2) or memory.limit_in_bytes (v1)
}

// errNoMemoryCgroup is findCgroupMemory's answer when no memory
// controller is found.
var errNoMemoryCgroup = errors.New("no cgroup memory controller (neither v2 memory.max nor v1 memory.limit_in_bytes)")

// findCgroupMemory finds the memory controller of the cgroup that
// procCgroup (the text of /proc/<pid>/cgroup) names, under root (cgroupFS):
// cgroup v2's memory.max when the unified hierarchy has one, else v1's
// memory hierarchy. In a cgroup namespace the path is "/" and the mount
// point is the cgroup itself.
func findCgroupMemory(procCgroup, root string) (cgroupMemory, error) {
	var v1, v2 string
	for line := range strings.SplitSeq(procCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			v2 = f[2]
		case hasController(f[1], "memory"):
			v1 = f[2]
		}
	}
	var candidates []cgroupMemory
	if v2 != "" {
		candidates = append(candidates, cgroupMemory{dir: filepath.Join(root, v2), top: root, file: "memory.max"})
	}
	if v1 != "" {
		top := filepath.Join(root, "memory")
		candidates = append(candidates, cgroupMemory{dir: filepath.Join(top, v1), top: top, file: "memory.limit_in_bytes"})
	}
	for _, c := range candidates {
		// The v2 root has no memory.max: no limit there, try v1.
		if _, err := os.Stat(filepath.Join(c.dir, c.file)); err == nil {
			return c, nil
		}
	}
	return cgroupMemory{}, errNoMemoryCgroup
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// limit is the lowest memory limit of c's cgroup and its parents, in
// bytes, or 0 if none is set.
func (c cgroupMemory) limit() (int64, error) {
	var lowest int64
	for dir := c.dir; ; dir = filepath.Dir(dir) {
		b, err := os.ReadFile(filepath.Join(dir, c.file))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// the v2 root has no memory.max
		case err != nil:
			return 0, err
		default:
			s := strings.TrimSpace(string(b))
			if s == "max" {
				break
			}
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", filepath.Join(dir, c.file), err)
			}
			if n > 0 && n < noLimit && (lowest == 0 || n < lowest) {
				lowest = n
			}
		}
		if len(dir) <= len(c.top) {
			return lowest, nil
		}
	}
}

// cgroupMemoryLimit is this process's cgroup memory limit, or 0.
func cgroupMemoryLimit() (int64, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, nil // not Linux, or no /proc: no cgroup to honour
	}
	c, err := findCgroupMemory(string(b), cgroupFS)
	if errors.Is(err, errNoMemoryCgroup) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return c.limit()
}

// memoryLimit sets the Go runtime's memory limit from the cgroup's when
// GOMEMLIMIT is unset (see defaultMemLimitPercent) and returns the limit in
// force, or 0 if there is none.
func memoryLimit(logger *slog.Logger) int64 {
	cg, err := cgroupMemoryLimit()
	if err != nil {
		logger.Warn("cannot read the cgroup memory limit", "error", err)
	}
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set && cg > 0 {
		soft := cg / 100 * defaultMemLimitPercent
		debug.SetMemoryLimit(soft)
		logger.Info("GOMEMLIMIT unset: set from the cgroup memory limit", "cgroup_limit", cg, "gomemlimit", soft)
	}
	return limitInForce(debug.SetMemoryLimit(-1), cg)
}

// limitInForce is the lower of the runtime's limit (MaxInt64 when none)
// and the cgroup's (0 when none), or 0 when neither is set.
func limitInForce(runtime, cgroup int64) int64 {
	l := runtime
	if cgroup > 0 && cgroup < l {
		l = cgroup
	}
	if l == math.MaxInt64 {
		return 0
	}
	return l
}
