//go:build !linux

package bench

import (
	"errors"
	"os/exec"
	"syscall"
	"time"
)

var errNotLinux = errors.New("bench: process statistics need Linux /proc")

func procCPU(int) (time.Duration, error)        { return 0, errNotLinux }
func procRSS(int) (int64, error)                { return 0, errNotLinux }
func cpuTimes() (idle, total uint64, err error) { return 0, 0, errNotLinux }
func kernelRelease() string                     { return "unknown" }
func machineBusy() (time.Duration, error)       { return 0, errNotLinux }
func cpuModel() string                          { return "" }
func isolate(*exec.Cmd)                         {}
func ownNetns(*exec.Cmd)                        {}
func netnsInode(int) (uint64, error)            { return 0, errNotLinux }
func netnsUnavailable() error                   { return errNotLinux }
func lowestPriority() error                     { return errNotLinux }

func bindNoPort(string, string, syscall.RawConn) error { return nil }
