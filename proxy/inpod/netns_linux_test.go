package inpod_test

import (
	"fmt"
	"net"
	"os"
	"sync"
	"testing"

	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/proxy/inpod"
	"github.com/gozt/gozt/proxy/netns"
)

// Root-only tests: real network namespaces made with ip(8). Without root
// they skip with a loud message, unless GOZT_REQUIRE_ROOT=1 (CI), where
// they fail.

// newNetns makes a network namespace for the test and returns its path.
func newNetns(t *testing.T) string { return "/run/netns/" + nstest.NewNetns(t) }

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
		c.Start = func(uid string, info inpod.WorkloadInfo, ns *netns.Handle) (inpod.Pod, error) {
			l, seen, err := nstest.ListenIn(ns.Run)
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
	host := nstest.PathInode(t, "/proc/self/ns/net")
	for i, path := range paths {
		want := nstest.PathInode(t, path)
		if want == host {
			t.Fatalf("netns %s is the host's", path)
		}
		mu.Lock()
		p := pods[fmt.Sprint("pod", i)]
		mu.Unlock()
		if p.seen != want {
			t.Errorf("pod%d: Start's fn ran in netns %d, want %d", i, p.seen, want)
		}
		if err := nstest.CheckSocketNetns(p.l.(*net.TCPListener), want); err != nil {
			t.Errorf("pod%d: %v", i, err)
		}
	}
	if got := nstest.PathInode(t, "/proc/thread-self/ns/net"); got != host {
		t.Errorf("test goroutine's thread is in netns %d, want the host's %d", got, host)
	}
}
