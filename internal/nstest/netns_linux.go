package nstest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// SocketNetns returns the inode of the network namespace socket c belongs
// to (SIOCGSKNS), whichever thread asks.
func SocketNetns(c syscall.Conn) (uint64, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var ino uint64
	var opErr error
	err = rc.Control(func(fd uintptr) {
		nsfd, err := unix.IoctlRetInt(int(fd), unix.SIOCGSKNS)
		if err != nil {
			opErr = fmt.Errorf("SIOCGSKNS: %w", err)
			return
		}
		defer unix.Close(nsfd)
		var st unix.Stat_t
		if opErr = unix.Fstat(nsfd, &st); opErr == nil {
			ino = st.Ino
		}
	})
	return ino, errors.Join(err, opErr)
}

// Inode returns the inode of the file at path, such as a namespace's
// /run/netns/NAME or /proc/self/task/TID/ns/net.
func Inode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Ino, nil
}

// PathInode is Inode failing t on error.
func PathInode(t testing.TB, path string) uint64 {
	t.Helper()
	ino, err := Inode(path)
	if err != nil {
		t.Fatal(err)
	}
	return ino
}

// ThreadNetns returns the inode of the calling goroutine's thread's
// network namespace. The goroutine is locked while it looks, so the answer
// is about one thread.
func ThreadNetns() (uint64, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return Inode("/proc/thread-self/ns/net")
}

// CurrentNetns is ThreadNetns failing t on error.
func CurrentNetns(t testing.TB) uint64 {
	t.Helper()
	ino, err := ThreadNetns()
	if err != nil {
		t.Fatal(err)
	}
	return ino
}

// CheckAllThreads checks that every thread of the process is in the netns
// with inode want.
func CheckAllThreads(t testing.TB, want uint64) {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		ino, err := Inode("/proc/self/task/" + task.Name() + "/ns/net")
		if err != nil {
			continue // the thread exited meanwhile
		}
		if ino != want {
			t.Errorf("thread %s is in netns %d, want %d", task.Name(), ino, want)
		}
	}
}

// ListenIn makes a TCP listener on 127.0.0.1 through run (a namespace's
// Run) and returns it with the netns inode its function saw on its thread.
func ListenIn(run func(func() error) error) (net.Listener, uint64, error) {
	var l net.Listener
	var seen uint64
	err := run(func() error {
		var err error
		if seen, err = Inode("/proc/thread-self/ns/net"); err != nil {
			return err
		}
		l, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	})
	return l, seen, err
}

// CheckSocketNetns returns an error unless c's socket is in the netns with
// inode want.
func CheckSocketNetns(c syscall.Conn, want uint64) error {
	got, err := SocketNetns(c)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("socket is in netns %d, want %d", got, want)
	}
	return nil
}

// SocketProtocol returns c's socket's protocol (SO_PROTOCOL): IPPROTO_TCP
// for a plain TCP socket, IPPROTO_MPTCP for a Multipath TCP one.
func SocketProtocol(c syscall.Conn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var proto int
	var perr error
	if err := rc.Control(func(fd uintptr) { proto, perr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL) }); err != nil {
		return 0, err
	}
	return proto, perr
}
