package main

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// writeFiles creates each path (relative to root) with its content.
func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for path, content := range files {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCgroupMemoryLimit: the limit of cgroup v2 (memory.max) or v1
// (memory.limit_in_bytes) is found from /proc/self/cgroup's text, the
// lowest of the cgroup's and its parents', "max" and v1's unlimited read as
// none, v2 wins over v1 when both exist, and a missing controller is an
// error findCgroupMemory names.
func TestCgroupMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name, proc string
		files      map[string]string
		want       int64
		wantErr    error
	}{
		{"v2", "0::/kubepods/pod1/ztunnel\n", map[string]string{
			"kubepods/memory.max": "max\n", "kubepods/pod1/memory.max": "1073741824\n", "kubepods/pod1/ztunnel/memory.max": "268435456\n",
		}, 256 << 20, nil},
		{"v2 parent lower", "0::/a/b\n", map[string]string{"a/memory.max": "134217728\n", "a/b/memory.max": "max\n"}, 128 << 20, nil},
		{"v2 unlimited", "0::/a\n", map[string]string{"a/memory.max": "max\n"}, 0, nil},
		{"v1", "4:memory:/process_api/x\n0::/\n", map[string]string{
			"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/process_api/x/memory.limit_in_bytes": "268435456\n",
		}, 256 << 20, nil},
		{"v1 combined controllers", "3:cpu,memory:/x\n", map[string]string{"memory/x/memory.limit_in_bytes": "1048576\n"}, 1 << 20, nil},
		{"v1 unlimited", "4:memory:/x\n", map[string]string{"memory/x/memory.limit_in_bytes": "9223372036854771712\n"}, 0, nil},
		{"v2 and v1: v2 wins", "4:memory:/x\n0::/y\n", map[string]string{
			"memory/x/memory.limit_in_bytes": "1048576\n", "y/memory.max": "2097152\n",
		}, 2 << 20, nil},
		{"v2 root only, v1 limit", "4:memory:/x\n0::/\n", map[string]string{"memory/x/memory.limit_in_bytes": "1048576\n"}, 1 << 20, nil},
		{"no controller", "1:cpu:/\n0::/\n", nil, 0, errNoMemoryCgroup},
	} {
		root := t.TempDir()
		writeFiles(t, root, tc.files)
		c, err := findCgroupMemory(tc.proc, root)
		if !errors.Is(err, tc.wantErr) {
			t.Errorf("%s: findCgroupMemory = %+v, %v; want error %v", tc.name, c, err, tc.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		if got, err := c.limit(); err != nil || got != tc.want {
			t.Errorf("%s: limit() = %d, %v; want %d", tc.name, got, err, tc.want)
		}
	}
	root := t.TempDir()
	writeFiles(t, root, map[string]string{"a/memory.max": "lots\n"})
	c, err := findCgroupMemory("0::/a", root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.limit(); err == nil {
		t.Error("limit() of an unparsable memory.max succeeded")
	}
}

func TestLimitInForce(t *testing.T) {
	for _, tc := range []struct{ runtime, cgroup, want int64 }{
		{math.MaxInt64, 0, 0},
		{math.MaxInt64, 256 << 20, 256 << 20},
		{200 << 20, 256 << 20, 200 << 20},
		{300 << 20, 256 << 20, 256 << 20},
		{100 << 20, 0, 100 << 20},
	} {
		if got := limitInForce(tc.runtime, tc.cgroup); got != tc.want {
			t.Errorf("limitInForce(%d, %d) = %d, want %d", tc.runtime, tc.cgroup, got, tc.want)
		}
	}
}
