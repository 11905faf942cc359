package inpod_test

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/proxy/inpod"
)

// Root-only tests: real network namespaces made with ip(8). Without root
// they skip with a loud message, unless GOZT_REQUIRE_ROOT=1 (CI), where
// they fail.

// newNetns makes a network namespace for the test and returns its path.
func newNetns(t *testing.T) string { return "/run/netns/" + nstest.NewNetns(t) }

func statInode(t *testing.T, path string) uint64 {
	t.Helper()
	ino, err := inodeOf(path)
	if err != nil {
		t.Fatal(err)
	}
	return ino
}

func inodeOf(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Ino, nil
}

// listenIn makes a TCP listener inside ns and returns it with the netns
// inode fn saw on its thread.
func listenIn(ns *inpod.Netns) (net.Listener, uint64, error) {
	var l net.Listener
	var seen uint64
	err := ns.Run(func() error {
		var err error
		if seen, err = inodeOf("/proc/thread-self/ns/net"); err != nil {
			return err
		}
		l, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	})
	return l, seen, err
}

// checkListenerNetns checks that l's socket is in the namespace with inode
// want.
func checkListenerNetns(l net.Listener, want uint64) error {
	got, err := nstest.SocketNetns(l.(*net.TCPListener))
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("listener's socket is in netns %d, want %d", got, want)
	}
	return nil
}

// listenerPod is a Pod holding one listener made inside its netns.
type listenerPod struct {
	l    net.Listener
	seen uint64 // netns inode on the thread that made l
}

func (p *listenerPod) Stop() { p.l.Close() }

// TestStartInPodNetns: pods added through ZDS with real netns fds get a
// Netns whose Run puts sockets in that pod's namespace, not the host's or
// the other pod's.
func TestStartInPodNetns(t *testing.T) {
	nstest.RequireRoot(t, "ip")
	paths := []string{newNetns(t), newNetns(t)}
	var mu sync.Mutex
	pods := map[string]*listenerPod{}
	h := newHarness(t, func(c *inpod.Config) {
		c.Start = func(uid string, info inpod.WorkloadInfo, ns *inpod.Netns) (inpod.Pod, error) {
			l, seen, err := listenIn(ns)
			if err != nil {
				return nil, err
			}
			p := &listenerPod{l: l, seen: seen}
			mu.Lock()
			pods[uid] = p
			mu.Unlock()
			return p, nil
		}
	})
	c := h.accept()
	for i, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		uid := fmt.Sprint("pod", i)
		ack, err := c.Add(uid, infoFor(uid), int(f.Fd()))
		f.Close()
		mustAck(t, "Add "+uid, ack, err)
	}
	ack, err := c.SnapshotSent()
	mustAck(t, "SnapshotSent", ack, err)
	host := statInode(t, "/proc/self/ns/net")
	for i, path := range paths {
		want := statInode(t, path)
		if want == host {
			t.Fatalf("netns %s is the host's", path)
		}
		mu.Lock()
		p := pods[fmt.Sprint("pod", i)]
		mu.Unlock()
		if p.seen != want {
			t.Errorf("pod%d: Start's fn ran in netns %d, want %d", i, p.seen, want)
		}
		if err := checkListenerNetns(p.l, want); err != nil {
			t.Errorf("pod%d: %v", i, err)
		}
	}
	if got := statInode(t, "/proc/thread-self/ns/net"); got != host {
		t.Errorf("test goroutine's thread is in netns %d, want the host's %d", got, host)
	}
}

// TestRunConcurrentManyNetns: many goroutines make sockets in many
// namespaces at once; each socket lands in its own namespace, and
// afterwards no thread of the process is left in a foreign one.
func TestRunConcurrentManyNetns(t *testing.T) {
	nstest.RequireRoot(t, "ip")
	const nsCount, workers, rounds = 6, 32, 8
	host := statInode(t, "/proc/self/ns/net")
	var nss []*inpod.Netns
	var inodes []uint64
	for range nsCount {
		path := newNetns(t)
		ns, err := inpod.OpenNetns(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Close() })
		nss = append(nss, ns)
		inodes = append(inodes, statInode(t, path))
	}

	errs := make(chan error, workers*rounds*2)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				i := (w + r) % nsCount
				l, seen, err := listenIn(nss[i])
				if err != nil {
					errs <- err
					continue
				}
				if seen != inodes[i] {
					errs <- fmt.Errorf("worker %d: fn ran in netns %d, want %d", w, seen, inodes[i])
				}
				if err := checkListenerNetns(l, inodes[i]); err != nil {
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
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		ino, err := inodeOf("/proc/self/task/" + task.Name() + "/ns/net")
		if err != nil {
			continue // the thread exited meanwhile
		}
		if ino != host {
			t.Errorf("thread %s is in netns %d, want the host's %d", task.Name(), ino, host)
		}
	}
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
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	got, err := inodeOf("/proc/thread-self/ns/net")
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("goroutine outside Run is on a thread in netns %d, want %d", got, want)
	}
	return nil
}
