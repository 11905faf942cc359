package netns_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/internal/proctest"
	"github.com/gozt/gozt/proxy/netns"
)

// TestEnterFD checks Home, which must name the process's own
// namespace even when asked from a thread inside another, and
// EnterFD, which must run fn in the namespace until fn leaves,
// then outside, return fn's error and panic, and leave every thread of the
// process at home.
func TestEnterFD(t *testing.T) {
	nstest.RequireRoot(t, "ip")
	path := "/run/netns/" + nstest.NewNetns(t)
	outside := nstest.CurrentNetns(t)
	nsFile, home := open(t, path)
	if got := fileInode(t, home); got != outside {
		t.Errorf("Home is netns %d, want the process's %d", got, outside)
	}
	var fromInside *os.File
	if err := nstest.InNetns(path, func() (err error) {
		fromInside, err = netns.Home()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer fromInside.Close()
	if got := fileInode(t, fromInside); got != outside {
		t.Errorf("Home asked from inside a netns is netns %d, want the process's %d", got, outside)
	}

	nsfd, homefd := int(nsFile.Fd()), int(home.Fd())
	var inside, after uint64
	var ln, outLn net.Listener
	var leaveErrs [2]error
	err := netns.EnterFD(nsfd, homefd, func(leave func() error) (err error) {
		inside = nstest.CurrentNetns(t)
		if ln, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
			return err
		}
		leaveErrs[0], leaveErrs[1] = leave(), leave()
		after = nstest.CurrentNetns(t)
		outLn, err = net.Listen("tcp4", "127.0.0.1:0")
		return err
	})
	if err != nil {
		t.Fatalf("EnterFD: %v", err)
	}
	defer ln.Close()
	defer outLn.Close()
	if want := fileInode(t, nsFile); inside != want {
		t.Errorf("fn ran in netns %d, want %d", inside, want)
	}
	if after != outside {
		t.Errorf("after leave fn ran in netns %d, want the process's %d", after, outside)
	}
	if leaveErrs != [2]error{} {
		t.Errorf("leave, twice: %v", leaveErrs)
	}
	if c, err := net.Dial("tcp4", ln.Addr().String()); err == nil {
		c.Close()
		t.Errorf("dialed %v from outside the namespace; the listener was not made inside it", ln.Addr())
	}
	if c, err := net.Dial("tcp4", outLn.Addr().String()); err != nil {
		t.Errorf("the listener made after leave is not the process's: %v", err)
	} else {
		c.Close()
	}
	errFn := errors.New("fn failed")
	if err := netns.EnterFD(nsfd, homefd, func(func() error) error { return errFn }); !errors.Is(err, errFn) {
		t.Errorf("EnterFD error = %v, want fn's %v", err, errFn)
	}
	for _, leaveFirst := range []bool{false, true} {
		func() {
			defer func() {
				if v := recover(); v != "boom" {
					t.Errorf("recovered %v, want fn's panic value", v)
				}
			}()
			netns.EnterFD(nsfd, homefd, func(leave func() error) error {
				if leaveFirst {
					leave()
				}
				panic("boom")
			})
			t.Error("EnterFD returned after fn panicked")
		}()
	}
	nstest.CheckAllThreads(t, outside)

}

// TestEnterFDNoWayHome: a thread that cannot go home (here: no
// home descriptor) ends the process with exit status 2 and a line saying
// why, even under a recover, such as a connection handler's, which a panic
// would not get past. The test runs itself again as the process to end.
func TestEnterFDNoWayHome(t *testing.T) {
	if nsPath := os.Getenv("GOZT_TEST_NO_WAY_HOME"); nsPath != "" {
		f, err := os.Open(nsPath)
		if err != nil {
			t.Fatal(err)
		}
		func() {
			defer func() { recover() }()
			netns.EnterFD(int(f.Fd()), -1, func(func() error) error { return nil })
		}()
		fmt.Println("went on after the thread could not go home")
		os.Exit(0)
	}
	nstest.RequireRoot(t, "ip")
	path := "/run/netns/" + nstest.NewNetns(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestEnterFDNoWayHome$")
	cmd.Env = append(os.Environ(), "GOZT_TEST_NO_WAY_HOME="+path)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "gozt: fatal: a thread cannot return from a network namespace") {
		t.Errorf("with no way home: %v, output:\n%s\nwant exit status 2 and the fatal line", err, out)
	}
}

// open opens the namespace at path and the process's own (Home) until t
// ends.
func open(t *testing.T, path string) (nsf, home *os.File) {
	t.Helper()
	nsf, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nsf.Close() })
	if home, err = netns.Home(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { home.Close() })
	return nsf, home
}

// fileInode returns the inode of an open file.
func fileInode(t *testing.T, f *os.File) uint64 {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestHandleRunConcurrently: many goroutines make sockets in many
// namespaces at once; each socket lands in its own namespace, and
// afterwards no thread of the process is left in a foreign one.
func TestHandleRunConcurrently(t *testing.T) {
	nstest.RequireRoot(t, "ip")
	const nsCount, workers, rounds = 6, 32, 8
	host := nstest.PathInode(t, "/proc/self/ns/net")
	var nss []*netns.Handle
	var inodes []uint64
	for range nsCount {
		path := "/run/netns/" + nstest.NewNetns(t)
		ns, err := netns.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Close() })
		nss = append(nss, ns)
		inodes = append(inodes, nstest.PathInode(t, path))
	}

	errs := make(chan error, workers*rounds*2)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				i := (w + r) % nsCount
				l, seen, err := nstest.ListenIn(nss[i].Run)
				if err != nil {
					errs <- err
					continue
				}
				if seen != inodes[i] {
					errs <- fmt.Errorf("worker %d: fn ran in netns %d, want %d", w, seen, inodes[i])
				}
				if err := nstest.CheckSocketNetns(l.(*net.TCPListener), inodes[i]); err != nil {
					errs <- fmt.Errorf("worker %d: %v", w, err)
				}
				l.Close()
			}
		})
		// Goroutines outside Run, interleaved, must stay in the host netns.
		wg.Go(func() {
			for range rounds {
				if err := checkThreadNetns(host); err != nil {
					errs <- err
				}
				runtime.Gosched()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Every OS thread of the process is back in the host netns.
	nstest.CheckAllThreads(t, host)
	// And so is a fresh batch of goroutines, each pinned to a thread.
	var wg2 sync.WaitGroup
	errs2 := make(chan error, 64)
	for range 64 {
		wg2.Go(func() {
			if err := checkThreadNetns(host); err != nil {
				errs2 <- err
			}
		})
	}
	wg2.Wait()
	close(errs2)
	for err := range errs2 {
		t.Error(err)
	}
}

// checkThreadNetns checks, pinned to its thread, that the calling
// goroutine's thread is in the netns with inode want.
func checkThreadNetns(want uint64) error {
	got, err := nstest.ThreadNetns()
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("goroutine outside Run is on a thread in netns %d, want %d", got, want)
	}
	return nil
}

// TestHandlesShareHome: each Handle holds one descriptor, its namespace's;
// the process's own namespace is opened once for all of them (a node of 110
// pods holds one, not 110), and Close frees the handle's own.
func TestHandlesShareHome(t *testing.T) {
	nstest.RequireRoot(t, "ip")
	path := "/run/netns/" + nstest.NewNetns(t)
	first, err := netns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	before := len(proctest.FDs(t, os.Getpid()))
	var hs []*netns.Handle
	for range 10 {
		h, err := netns.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	if got := len(proctest.FDs(t, os.Getpid())) - before; got != 10 {
		t.Errorf("10 more handles hold %d more descriptors, want 10 (the home namespace shared)", got)
	}
	for _, h := range hs {
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(proctest.FDs(t, os.Getpid())); got != before {
		t.Errorf("%d descriptors after closing the handles, %d before them", got, before)
	}
	// The handles still enter and come home after others closed.
	l, seen, err := nstest.ListenIn(first.Run)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if seen != nstest.PathInode(t, path) {
		t.Errorf("Run after other handles closed ran in netns %d, want %d", seen, nstest.PathInode(t, path))
	}
	nstest.CheckAllThreads(t, nstest.CurrentNetns(t))
}
